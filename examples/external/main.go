// Command external is a Go trainer in a module of its own that uses gear the
// way a user's repository does:
//
//	go get github.com/gear-rl/gear
//	go build -o trainer . && gearrun -np 2 ./trainer
//
// (this copy's go.mod points github.com/gear-rl/gear at the repository that
// holds it, with a replace directive). Every rank joins the world, checks an
// allreduce, then writes items into its own shard of a replay table that
// spans the ranks; the ranks sample a batch from the whole table together
// (GEAR's split draw), collect its rows from whichever rank owns them, and
// check each row against the rank that wrote it.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/sample"
	"github.com/gear-rl/gear/store"
)

const (
	itemsPerRank = 32
	batch        = 64
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "external:", err)
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
	comm, err := w.CommContext(ctx)
	if err != nil {
		return err
	}

	// An allreduce: rank r contributes r+1.
	sum := []float64{float64(w.Rank() + 1)}
	if err := collective.AllReduce(ctx, comm, sum, collective.Sum); err != nil {
		return err
	}
	n := float64(w.Size())
	if want := n * (n + 1) / 2; sum[0] != want {
		return fmt.Errorf("allreduce: sum %g, want %g", sum[0], want)
	}
	fmt.Printf("rank %d of %d: allreduce sum %g: ok\n", w.Rank(), w.Size(), sum[0])

	// A replay table over every rank: this rank's shard lives in shared memory,
	// named after the job so that gearrun removes it when the job ends.
	sh, err := store.Create(rank.SegmentName(w.JobID(), fmt.Sprintf("external.%d", w.Rank())), store.Spec{
		Capacity: itemsPerRank + 1,
		Remover:  store.RemoverNone,
		Columns:  []store.Column{{Name: "obs", DType: store.Int64, Shape: []int{2}, Length: 1}},
	})
	if err != nil {
		return err
	}
	defer sh.Close()
	local, err := sample.NewShardTable(sh, sample.Config{Name: "replay", Sampler: sample.NewUniform(), Remover: sample.NewFIFO()})
	if err != nil {
		return err
	}
	defer local.Close()
	tableComm, err := comm.Split(ctx, 0, w.Rank()) // the table's own communicator
	if err != nil {
		return err
	}
	table, err := sample.NewDistTable(ctx, tableComm, local, sample.WithSeed(1))
	if err != nil {
		return err
	}
	defer table.Close()

	// Each rank writes its items in place: obs = (writer's rank, item number).
	for k := range itemsPerRank {
		_, err := local.Insert(ctx, uint64(w.Rank()*itemsPerRank+k), 1, func(p store.Pending) error {
			b := p.Block(0)
			binary.LittleEndian.PutUint64(b[0:], uint64(w.Rank()))
			binary.LittleEndian.PutUint64(b[8:], uint64(k))
			return nil
		})
		if err != nil {
			return err
		}
	}
	if err := comm.Barrier(ctx); err != nil { // every shard is written
		return err
	}

	// Sample from the whole table, together, then collect the rows.
	b, err := table.Sample(ctx, batch)
	if err != nil {
		return err
	}
	defer b.Release()
	indices := make([]int, len(b.Items))
	for i, it := range b.Items {
		indices[i] = it.Index
	}
	rows, err := table.Collect(ctx, indices, []string{"obs"}, sample.Window{})
	if err != nil {
		return err
	}
	perShard := make([]int, w.Size())
	for i, idx := range indices {
		owner := idx / table.Capacity() // global index = shard*capacity + row
		row := rows[0][i*16 : (i+1)*16]
		writer, k := binary.LittleEndian.Uint64(row[0:]), binary.LittleEndian.Uint64(row[8:])
		if int(writer) != owner || k >= itemsPerRank || b.Items[i].Key != uint64(owner*itemsPerRank)+k {
			return fmt.Errorf("item %d (global index %d, key %d): row holds writer %d item %d", i, idx, b.Items[i].Key, writer, k)
		}
		perShard[owner]++
	}
	if len(indices) != batch {
		return fmt.Errorf("sampled %d items, want %d", len(indices), batch)
	}
	for s, c := range perShard {
		if c == 0 {
			return errors.New("no item came from shard " + fmt.Sprint(s))
		}
	}
	fmt.Printf("rank %d of %d: sampled %d items, per shard %v, every row from its writer: ok\n", w.Rank(), w.Size(), len(indices), perShard)
	return nil
}
