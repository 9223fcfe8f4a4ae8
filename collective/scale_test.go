package collective_test

import (
	"context"
	"fmt"
	"math/bits"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/launch/launchtest"
	"github.com/gear-rl/gear/rank"
)

// Many ranks on one host: the shared memory a communicator takes grows with
// the ranks and with the pages frames cross, not with the pairs of ranks.

// shmResident sums the resident bytes of the ranks' inboxes.
func shmResident(t *testing.T, comms []*collective.Comm) (size, resident int64) {
	t.Helper()
	for r, c := range comms {
		s, res := c.ShmUsage()
		if s <= 0 || res < 0 {
			t.Fatalf("rank %d: ShmUsage = %d, %d", r, s, res)
		}
		size += s
		resident += res
	}
	return size, resident
}

// TestShmManyRanks builds a communicator of 64 in-process ranks over shared
// memory: setup touches the inboxes' headers alone, an 8-byte AllReduce adds a
// page per ring it crosses, and the shrunken rings (512 KiB of 64 KiB chunks at
// 64 ranks) carry multi-chunk AllReduce and AllToAll correctly.
func TestShmManyRanks(t *testing.T) {
	const n = 64
	comms, _ := collectivetest.Comms(t, n, collectivetest.Config{Transport: collectivetest.Shm})
	def := collective.DefaultTuning()
	size, resident := shmResident(t, comms)
	if want := collective.ShmBytes(n, def); size != want {
		t.Errorf("inboxes of %d bytes in all, want ShmBytes %d", size, want)
	}
	if resident == 0 || resident > collective.ShmSetupBytes(n) {
		t.Errorf("after setup %d bytes resident, want 1 to ShmSetupBytes = %d", resident, collective.ShmSetupBytes(n))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := collectivetest.Each(ctx, comms, func(ctx context.Context, c *collective.Comm) error {
		buf := []int64{int64(c.Rank() + 1)}
		if err := collective.AllReduce(ctx, c, buf, collective.Sum); err != nil {
			return err
		}
		if buf[0] != n*(n+1)/2 {
			return fmt.Errorf("rank %d: sum %d, want %d", c.Rank(), buf[0], n*(n+1)/2)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	// Recursive doubling: log2(n) peers send to each rank; the first page or
	// two of each of their rings (a ring's head and its first frame may lie on
	// both sides of a page boundary), the header page and the live words' page.
	perRank := int64(2*bits.Len(n-1)+2) * 4096
	_, resident = shmResident(t, comms)
	if resident > n*perRank {
		t.Errorf("after an 8-byte AllReduce %d bytes resident, want at most %d (%d a rank)", resident, n*perRank, perRank)
	}
	t.Logf("%d ranks: inboxes of %d bytes, %d resident after setup and an 8-byte AllReduce", n, size, resident)

	// Several chunks per rank through the shrunken rings, and every pair.
	count := 3*64<<10/4 + 13
	errs = collectivetest.Each(ctx, comms, func(ctx context.Context, c *collective.Comm) error {
		buf := make([]float32, count)
		collectivetest.Fill(buf, c.Rank(), 0)
		if err := collective.AllReduce(ctx, c, buf, collective.Sum); err != nil {
			return err
		}
		if err := collectivetest.Compare("AllReduce", buf, collectivetest.References[float32](n, collective.Sum)); err != nil {
			return err
		}
		block := 5000
		send, recv := make([]int32, n*block), make([]int32, n*block)
		for i := range send {
			send[i] = int32(c.Rank()*1_000_000 + i)
		}
		if err := collective.AllToAll(ctx, c, send, recv); err != nil {
			return err
		}
		for j := range n {
			for k := range block {
				if want := int32(j*1_000_000 + c.Rank()*block + k); recv[j*block+k] != want {
					return fmt.Errorf("rank %d: AllToAll element %d of block %d is %d, want %d", c.Rank(), k, j, recv[j*block+k], want)
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
	if _, resident = shmResident(t, comms); resident > collective.ShmBytes(n, def) {
		t.Errorf("%d bytes resident, over ShmBytes %d", resident, collective.ShmBytes(n, def))
	}
}

// TestProcess128Ranks launches 128 real rank processes on this host (skipped
// under the race detector, which makes them too slow for a 2-core machine):
// each builds the world communicator and runs an 8-byte AllReduce; rank 0
// checks the shared memory all inboxes hold together against a page a ring the
// AllReduce crossed.
func TestProcess128Ranks(t *testing.T) {
	if raceEnabled {
		t.Skip("128 rank processes are too slow under the race detector")
	}
	const n = 128
	launchtest.RunRanks(t, n, func(t *testing.T, w *rank.World) {
		c := openComm(t, w)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		buf := []int64{int64(w.Rank() + 1)}
		if err := collective.AllReduce(ctx, c, buf, collective.Sum); err != nil {
			t.Fatalf("AllReduce: %v", err)
		}
		if buf[0] != n*(n+1)/2 {
			t.Fatalf("sum %d, want %d", buf[0], n*(n+1)/2)
		}
		size, resident := c.ShmUsage()
		shm := []int64{size, resident}
		if err := collective.AllReduce(ctx, c, shm, collective.Sum); err != nil {
			t.Fatalf("AllReduce of the usage: %v", err)
		}
		if w.Rank() == 0 {
			perRank := int64(2*bits.Len(n-1)+2) * 4096 // as in TestShmManyRanks
			if want := collective.ShmBytes(n, collective.DefaultTuning()); shm[0] != want {
				t.Errorf("inboxes of %d bytes, want ShmBytes %d", shm[0], want)
			}
			if shm[1] <= 0 || shm[1] > n*perRank {
				t.Errorf("%d bytes resident, want 1 to %d", shm[1], n*perRank)
			}
			fmt.Fprintf(os.Stderr, "%d ranks: inboxes of %d bytes, %d resident (%d CPUs)\n", n, shm[0], shm[1], runtime.NumCPU())
		}
		// Leave together, so that no rank exits while another still waits.
		if err := w.Barrier(ctx); err != nil {
			t.Fatalf("barrier: %v", err)
		}
	}, launchtest.Timeout(3*time.Minute))
}
