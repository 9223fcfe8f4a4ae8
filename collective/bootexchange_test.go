package collective

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"
)

// kvBootstrap is the key-value part of a Bootstrap, counting requests.
type kvBootstrap struct {
	mu       sync.Mutex
	cond     *sync.Cond
	kv       map[string][]byte
	requests int
}

func (b *kvBootstrap) set(key string, v []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.requests++
	b.kv[key] = bytes.Clone(v)
	b.cond.Broadcast()
}

func (b *kvBootstrap) wait(key string) []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.requests++
	for {
		if v, ok := b.kv[key]; ok {
			return bytes.Clone(v)
		}
		b.cond.Wait()
	}
}

type kvRank struct {
	b    *kvBootstrap
	rank int
	size int
}

func (r kvRank) Rank() int    { return r.rank }
func (r kvRank) Size() int    { return r.size }
func (r kvRank) Host() string { return "h" }
func (r kvRank) Set(_ context.Context, key string, v []byte) error {
	r.b.set(key, v)
	return nil
}
func (r kvRank) Wait(_ context.Context, key string) ([]byte, error) { return r.b.wait(key), nil }
func (r kvRank) OnLost(func(int, string)) func()                    { return func() {} }

// allGather through the bootstrap gives every rank every blob, with about 3n
// requests for n ranks, and falls back to reading every key when the blobs
// together are too large for one value.
func TestBootExchangeAllGather(t *testing.T) {
	for _, tc := range []struct {
		n, blob int
		maxReq  int
	}{
		{1, 10, 0},
		{2, 10, 6},
		{50, 300, 3 * 50},
		{3, gatherLimit / 2, 3 + 2 + 3*2 + 1}, // 768 KiB in all: every rank reads every key
	} {
		b := &kvBootstrap{kv: map[string][]byte{}}
		b.cond = sync.NewCond(&b.mu)
		outs := make([][][]byte, tc.n)
		errs := make([]error, tc.n)
		var wg sync.WaitGroup
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		for r := range tc.n {
			wg.Go(func() {
				ex := &bootExchange{b: kvRank{b, r, tc.n}, prefix: "p", rank: r, size: tc.n}
				blob := bytes.Repeat([]byte{byte(r + 1)}, tc.blob)
				outs[r], errs[r] = ex.allGather(ctx, blob)
			})
		}
		wg.Wait()
		cancel()
		for r := range tc.n {
			if errs[r] != nil {
				t.Fatalf("%d ranks: rank %d: %v", tc.n, r, errs[r])
			}
			for q := range tc.n {
				if !bytes.Equal(outs[r][q], bytes.Repeat([]byte{byte(q + 1)}, tc.blob)) {
					t.Fatalf("%d ranks of %d bytes: rank %d got a wrong blob of rank %d", tc.n, tc.blob, r, q)
				}
			}
		}
		if b.requests > tc.maxReq {
			t.Errorf("%d ranks of %d bytes: %d requests, want at most %d", tc.n, tc.blob, b.requests, tc.maxReq)
		}
	}
	if _, err := unpackBlobs(packBlobs([][]byte{{1, 2}, {3}})[:3], 2); err == nil {
		t.Error("a cut pack unpacked")
	}
}
