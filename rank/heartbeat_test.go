package rank

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// blackhole relays connections to target until cut, after which it moves no
// byte either way and closes nothing: what a host that vanishes from the
// network (a dead node, a pulled cable) looks like to its peers.
type blackhole struct {
	ln       net.Listener
	cut      atomic.Bool
	cutFirst atomic.Bool // cuts the first connection it relayed alone
	mu       sync.Mutex
	conns    []net.Conn
	wg       sync.WaitGroup
	target   string
}

func newBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: target}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			b.mu.Lock()
			first := len(b.conns) == 0
			b.conns = append(b.conns, in, out)
			b.mu.Unlock()
			b.wg.Add(2)
			go func() { defer b.wg.Done(); b.relay(out, in, first) }()
			go func() { defer b.wg.Done(); b.relay(in, out, first) }()
		}
	}()
	t.Cleanup(b.close)
	return b
}

func (b *blackhole) relay(dst, src net.Conn, first bool) {
	buf := make([]byte, 4096)
	for {
		n, err := src.Read(buf)
		if b.cut.Load() || first && b.cutFirst.Load() {
			io.Copy(io.Discard, src) // swallow everything from now on
			return
		}
		if n > 0 {
			dst.Write(buf[:n])
		}
		if err != nil {
			return
		}
	}
}

func (b *blackhole) close() {
	b.ln.Close()
	b.mu.Lock()
	for _, c := range b.conns {
		c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// TestLostHostNamedWithinTwoSeconds cuts a "host" holding ranks 1 and 2 off
// the network without closing any connection. The coordinator's heartbeat
// notices within its timeout: the surviving rank gets an error naming the
// host and both its ranks, and the cut-off ranks learn that the coordinator is
// gone.
func TestLostHostNamedWithinTwoSeconds(t *testing.T) { checkLostHost(t, 0) }

// TestLostHostTakesAllItsRanks cuts one rank of the host 200 ms before the
// other, as a host's ranks whose last words came apart cross the heartbeat
// timeout at different checks: the host still goes with both its ranks, not
// first with one of them alone.
func TestLostHostTakesAllItsRanks(t *testing.T) { checkLostHost(t, 200*time.Millisecond) }

func checkLostHost(t *testing.T, stagger time.Duration) {
	worlds, bh := hostOfTwo(t)
	cut := time.Now()
	if stagger > 0 {
		bh.cutFirst.Store(true)
		time.Sleep(stagger)
	}
	bh.cut.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := worlds[0].Barrier(ctx)
	took := time.Since(cut)
	var lost *LostError
	if !errors.As(err, &lost) {
		t.Fatalf("barrier after the cut: %v, want a LostError", err)
	}
	t.Logf("%v after the cut: %v", took.Round(time.Millisecond), err)
	if took > 2*time.Second {
		t.Errorf("the lost host was named after %v, want within 2s", took)
	}
	for _, want := range []string{"on n2 lost", "host n2 unreachable", "its ranks 1-2"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	for r := 1; r < 3; r++ {
		deadline := time.Now().Add(5 * time.Second)
		for worlds[r].Err() == nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if err := worlds[r].Err(); !errors.Is(err, ErrCoordinatorGone) {
			t.Errorf("cut-off rank %d: %v, want ErrCoordinatorGone", r, err)
		}
	}
}

// hostOfTwo starts a world of 3 ranks whose ranks 1 and 2 are on host n2,
// which reaches the coordinator through the blackhole it returns; rank 0 is
// on n1. The heartbeat pings each 100 ms and gives up after 600 ms. It
// returns once a quiet second has passed with the world whole.
func hostOfTwo(t *testing.T) ([]*World, *blackhole) {
	t.Helper()
	c := newCoord(t, 3, func(cfg *CoordinatorConfig) {
		cfg.Heartbeat = 100 * time.Millisecond
		cfg.HeartbeatTimeout = 600 * time.Millisecond
	})
	bh := newBlackhole(t, c.Addr())
	worlds := make([]*World, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			info := testInfo(c, r, 3, "secret")
			host := "n1/0001"
			if r > 0 {
				info.RdzvAddr = bh.ln.Addr().String()
				host = "n2/0002"
			}
			worlds[r], errs[r] = Init(context.Background(), WithInfo(info), WithHostID(host),
				WithHeartbeatTimeout(600*time.Millisecond))
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		t.Cleanup(func() { worlds[r].Close() })
	}
	// Heartbeats keep a quiet world alive.
	time.Sleep(time.Second)
	if err := worlds[0].Err(); err != nil {
		t.Fatalf("a quiet world broke: %v", err)
	}
	return worlds, bh
}

// TestSilentRankGoesAloneWhileItsHostAnswers cuts one rank of host n2 and
// not the other: that rank is lost alone, named as a rank (not its host's
// ranks), since its host-mate goes on answering the pings.
func TestSilentRankGoesAloneWhileItsHostAnswers(t *testing.T) {
	worlds, bh := hostOfTwo(t)
	bh.cutFirst.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := worlds[0].Barrier(ctx)
	var lost *LostError
	if !errors.As(err, &lost) {
		t.Fatalf("barrier after the cut: %v, want a LostError", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "host n2 unreachable: no word from rank ") || strings.Contains(msg, "its ranks") {
		t.Errorf("error %q: want one rank of n2 named alone", msg)
	}
}
