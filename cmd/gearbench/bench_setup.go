package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/rank"
)

// procStart is when this process began running Go code: the setup benchmark
// counts from it.
var procStart = time.Now()

// setup: what it takes to get a usable world communicator. Every rank of a job
// started by gearrun joins the world (rank.Init), builds the communicator
// (collective.New), runs one 8-byte AllReduce (checked), and rank 0 prints one
// line:
//
//	init_s, comm_s, allreduce_s   the slowest rank's time in each step
//	ready_s                       the slowest rank's time from its start to the end of the AllReduce
//	shm_resident                  the bytes of the ranks' shared-memory inboxes the host holds (mincore, summed)
//	shm_statfs                    what /dev/shm's used space grew by meanwhile (rank 0's statfs; other work on the host counts too)
//	shm_mapped                    the size of the inboxes (every ring)
//	shm_budget, shm_setup         collective.ShmBytes and ShmSetupBytes for the ranks of the largest host
//	ring                          the capacity of one ring
//
//	gearrun -np 256 gearbench setup
//
// bench/peers/setup.sh runs it against the same program in MPI.
func benchSetup(args []string, out io.Writer) error {
	return runSetupBench(args, out, func(ctx context.Context) (*rank.World, func(), error) {
		w, err := rank.Init(ctx)
		if err != nil {
			return nil, nil, err
		}
		return w, func() { w.Close() }, nil
	})
}

func runSetupBench(args []string, out io.Writer, join func(ctx context.Context) (*rank.World, func(), error)) error {
	fs := flag.NewFlagSet("setup", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	jsonOut := fs.Bool("json", false, "print one JSON object")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after this long")
	shmDir := fs.String("shm", "/dev/shm", "the shared-memory file system whose use is measured")
	name := fs.String("name", "world", "the communicator's name")
	spin := fs.Duration("spin", -1, "shared-memory spin before sleeping (Tuning.Spin); negative: default")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	// Nothing of this job's communicator exists before every rank has joined,
	// so any rank's reading before rank.Init is the baseline.
	before := shmUsed(*shmDir)
	t0 := time.Now()
	w, leave, err := join(ctx)
	if err != nil {
		return err
	}
	defer leave()
	t1 := time.Now()
	tuning := collective.DefaultTuning()
	tuning.Spin = *spin
	c, err := collective.New(ctx, w, collective.WithTransport(os.Getenv(rank.EnvTransport)), collective.WithName(*name), collective.WithTuning(tuning))
	if err != nil {
		return err
	}
	defer c.Close()
	t2 := time.Now()
	buf := []float64{float64(w.Rank() + 1)}
	if err := collective.AllReduce(ctx, c, buf, collective.Sum); err != nil {
		return err
	}
	t3 := time.Now()
	n := c.Size()
	if want := float64(n * (n + 1) / 2); buf[0] != want {
		return fmt.Errorf("rank %d: 8-byte AllReduce gave %v, want %v", w.Rank(), buf[0], want)
	}
	size, resident := c.ShmUsage()
	// Every rank has run its AllReduce (and keeps its communicator) before
	// rank 0 reads /dev/shm again.
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	after := shmUsed(*shmDir)
	times := []float64{t1.Sub(t0).Seconds(), t2.Sub(t1).Seconds(), t3.Sub(t2).Seconds(), t3.Sub(procStart).Seconds()}
	if err := collective.AllReduce(ctx, c, times, collective.Max); err != nil {
		return err
	}
	shm := []int64{size, resident}
	if err := collective.AllReduce(ctx, c, shm, collective.Sum); err != nil {
		return err
	}
	// Leave together: a rank that exits while another still waits for its
	// last frames would make that one's communicator report it lost.
	if err := w.Barrier(ctx); err != nil {
		return err
	}
	local := 0
	for _, h := range c.Hosts() {
		local = max(local, len(h))
	}
	if w.Rank() != 0 {
		return nil
	}
	grew := int64(-1)
	if before >= 0 && after >= 0 {
		grew = after - before
	}
	t := collective.DefaultTuning()
	return emitter{out, *jsonOut}.emit(
		kv{"op", "setup"}, kv{"np", n}, kv{"local", local},
		kv{"init_s", times[0]}, kv{"comm_s", times[1]}, kv{"allreduce_s", times[2]}, kv{"ready_s", times[3]},
		kv{"shm_resident", shm[1]}, kv{"shm_statfs", grew}, kv{"shm_mapped", shm[0]},
		kv{"shm_budget", collective.ShmBytes(local, t)}, kv{"shm_setup", collective.ShmSetupBytes(local)},
		kv{"ring", collective.ShmRingBytes(local, t)})
}

// shmUsed is the space used in the file system at dir, or -1 if unknown.
func shmUsed(dir string) int64 {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return -1
	}
	return int64(st.Blocks-st.Bfree) * int64(st.Bsize)
}
