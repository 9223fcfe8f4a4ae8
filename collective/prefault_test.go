//go:build linux

package collective_test

import (
	"context"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/collective/collectivetest"
)

// TestRingPrefault: past its first chunk, a ring's writer maps the ring's pages
// a chunk ahead of its frames, so that the reader never faults on a page the
// writer has yet to fault on (two processes faulting on one page wait for each
// other in the kernel, and a preempted one held the other for a time slice).
// A ring that carries one small frame keeps a page or two, and one that
// carries nothing stays untouched.
func TestRingPrefault(t *testing.T) {
	comms, _ := collectivetest.Comms(t, 3, collectivetest.Config{Transport: collectivetest.Shm})
	resident := func() []int64 {
		out := make([]int64, len(comms))
		for r, c := range comms {
			_, out[r] = c.ShmUsage()
		}
		return out
	}
	// A frame from rank 0 to rank 1 of 8 bytes, then one to rank 2 of 20 KiB,
	// past the first chunk of its ring.
	big := (collective.PrefaultChunk + 4096) / 4
	send := func(to, n int) []int64 {
		t.Helper()
		before := resident()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		errs := collectivetest.Each(ctx, comms, func(ctx context.Context, c *collective.Comm) error {
			switch c.Rank() {
			case 0:
				buf := make([]int32, n)
				for i := range buf {
					buf[i] = int32(i)
				}
				return collective.Send(ctx, c, buf, to, 7)
			case to:
				buf := make([]int32, n)
				if err := collective.Recv(ctx, c, buf, 0, 7); err != nil {
					return err
				}
				for i, v := range buf {
					if v != int32(i) {
						t.Errorf("rank %d received %d at %d", to, v, i)
						break
					}
				}
			}
			return nil
		})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
		after := resident()
		grew := make([]int64, len(comms))
		for r := range grew {
			grew[r] = after[r] - before[r]
		}
		t.Logf("%d bytes from rank 0 to rank %d: inboxes grew by %v bytes", 4*n, to, grew)
		return grew
	}
	grew := send(1, 2)
	if grew[1] > 2*4096 {
		t.Errorf("one 8-byte frame grew rank 1's inbox by %d bytes, want at most two pages", grew[1])
	}
	if grew[0] != 0 || grew[2] != 0 {
		t.Errorf("one frame to rank 1 grew rank 0's inbox by %d bytes and rank 2's by %d, want 0", grew[0], grew[2])
	}
	grew = send(2, big)
	// The frame ends past the first chunk: the writer mapped the ring through
	// the chunk after the one the frame ends in (three chunks in all, less the
	// page a chunk may share with the ring's head).
	if want := int64(3*collective.PrefaultChunk - 4096); grew[2] < want {
		t.Errorf("a %d-byte frame grew rank 2's inbox by %d bytes, want at least %d (its ring mapped a chunk ahead)", 4*big, grew[2], want)
	}
	if grew[0] != 0 || grew[1] != 0 {
		t.Errorf("a frame to rank 2 grew rank 0's inbox by %d bytes and rank 1's by %d, want 0", grew[0], grew[1])
	}
}
