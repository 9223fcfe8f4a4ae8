// Command hello is the first gear program to run:
//
//	gearrun -np 4 ./examples/hello
//
// Every rank prints its place in the world; after a barrier, rank 0 prints the
// world's table, then the ranks build the world communicator and rank 0 prints
// the allreduce (sum) of all ranks. Run alone (go run ./examples/hello) it is a
// world of one.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/rank"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "hello:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	w, err := rank.Init(ctx)
	if err != nil {
		return err
	}
	defer w.Close()
	host, _ := os.Hostname()
	role := ""
	if w.Role() != "" {
		role = fmt.Sprintf(" role %s %d/%d", w.Role(), w.RoleRank(), w.RoleSize())
	}
	fmt.Printf("hello from rank %d of %d on %s (local %d/%d%s)\n",
		w.Rank(), w.Size(), host, w.LocalRank(), w.LocalSize(), role)
	if err := w.Barrier(ctx); err != nil {
		return err
	}
	if w.Rank() == 0 {
		fmt.Printf("world of %d ranks, job %s:\n", w.Size(), w.JobID())
		for _, p := range w.Peers() {
			fmt.Printf("  rank %d: pid %d host %s node %d local %d role %q/%d\n",
				p.Rank, p.PID, p.Host, p.Node, p.LocalRank, p.Role, p.RoleRank)
		}
	}
	// The world communicator: every rank adds its rank; all get the sum.
	comm, err := w.CommContext(ctx)
	if err != nil {
		return err
	}
	sum := []int64{int64(w.Rank())}
	if err := collective.AllReduce(ctx, comm, sum, collective.Sum); err != nil {
		return err
	}
	if w.Rank() == 0 {
		fmt.Printf("allreduce(sum of ranks) = %d\n", sum[0])
	}
	return nil
}
