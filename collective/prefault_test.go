//go:build linux

package collective_test

import (
	"context"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/collective/collectivetest"
)

// TestRingPrefault: the first frame on a ring maps the ring's pages a chunk
// ahead of it, in the writer, so that the reader never faults on a page the
// writer has yet to fault on (two processes faulting on one page wait for each
// other in the kernel, and a preempted one held the other for a time slice);
// a ring that carries nothing stays untouched.
func TestRingPrefault(t *testing.T) {
	comms, _ := collectivetest.Comms(t, 3, collectivetest.Config{Transport: collectivetest.Shm})
	before := make([]int64, len(comms))
	for r, c := range comms {
		_, before[r] = c.ShmUsage()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := collectivetest.Each(ctx, comms, func(ctx context.Context, c *collective.Comm) error {
		switch c.Rank() {
		case 0:
			return collective.Send(ctx, c, []int64{42}, 1, 7)
		case 1:
			buf := []int64{0}
			if err := collective.Recv(ctx, c, buf, 0, 7); err != nil {
				return err
			}
			if buf[0] != 42 {
				t.Errorf("rank 1 received %d, want 42", buf[0])
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	after := make([]int64, len(comms))
	for r, c := range comms {
		_, after[r] = c.ShmUsage()
	}
	// Rank 0 wrote one frame into rank 1's inbox and mapped the chunk after it:
	// two chunks of the ring, less the page a chunk may share with the ring's
	// head, were new.
	if grew, want := after[1]-before[1], int64(2*collective.PrefaultChunk-4096); grew < want {
		t.Errorf("rank 1's inbox grew by %d bytes after one frame, want at least %d (two chunks of its ring from rank 0)", grew, want)
	}
	// Nothing went to rank 0 or rank 2.
	for _, r := range []int{0, 2} {
		if after[r] != before[r] {
			t.Errorf("rank %d's inbox: %d bytes resident after setup, %d after a frame between ranks 0 and 1", r, before[r], after[r])
		}
	}
	t.Logf("resident bytes per inbox: after setup %v, after one frame from rank 0 to rank 1 %v", before, after)
}
