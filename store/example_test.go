package store_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/store"
)

// A shard's life: the owner creates it, a writer (any process that attaches by
// name, here the owner itself) allocates a row, writes its blocks in place and
// commits it, and a reader learns of the commit and reads the row without a copy.
func Example() {
	ctx := context.Background()
	spec := store.Spec{
		Capacity: 16,
		Columns: []store.Column{
			{Name: "obs", DType: store.Float32, Shape: []int{84, 84}, Length: 4},
			{Name: "action", DType: store.Int32, Length: 4},
			{Name: "reward", DType: store.Float32, Length: 4},
		},
		Remover: store.RemoverFIFO,
	}
	shard, err := store.Create(rank.SegmentName(rank.LocalJobID(), "store.example"), spec)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer shard.Close()

	// Writer: allocate, write in place, commit.
	p, err := shard.Allocate(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	obs, _ := store.Block[float32](p, 0) // 4 frames of 84x84, flattened
	for i := range obs {
		obs[i] = 0.5
	}
	_ = store.PutBlock(p, 1, []int32{0, 3, 3, 1})
	_ = store.PutBlock(p, 2, []float32{0, 0, 1, 0})
	if err := store.PutFrame(p, 0, 0, make([]float32, 84*83), 84, 83); err != nil {
		fmt.Println(err)
	}
	if _, err := p.CommitKey(42, 1.5); err != nil {
		fmt.Println(err)
		return
	}

	// Reader: new commits since sequence 0, then a pinned view of the row.
	rows, next, _ := shard.ReadCommits(0, nil, 16)
	for _, st := range rows {
		v, err := shard.Read(st.Ref())
		if err != nil {
			fmt.Println(err)
			continue
		}
		reward, _ := store.Block[float32](v, 2)
		fmt.Printf("row %d: key %d, priority %v, reward %v\n", st.Index, st.Key, st.Priority, reward)
		v.Done()
		_, _ = shard.MarkSampled(st.Ref())
	}
	fmt.Println("next sequence:", next)
	// Output:
	// store: column "obs": want 84x84 float32, got 84x83 float32
	// row 0: key 42, priority 1.5, reward [0 0 1 0]
	// next sequence: 1
}

// Checkpoint writes the shard to a file (atomically replaced) and Restore makes a
// new shard from it.
func ExampleShard_Checkpoint() {
	ctx := context.Background()
	spec := store.Spec{Capacity: 8, Columns: []store.Column{{Name: "x", DType: store.Int64, Length: 1}}}
	shard, err := store.Create(rank.SegmentName(rank.LocalJobID(), "store.example-ckpt"), spec)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer shard.Close()
	for i := range 3 {
		p, _ := shard.Allocate(ctx)
		_ = store.PutBlock(p, 0, []int64{int64(i * i)})
		_, _ = p.Commit(float64(i))
	}
	dir, _ := os.MkdirTemp("", "ckpt")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "shard.ckpt")
	if err := shard.Checkpoint(ctx, path); err != nil {
		fmt.Println(err)
		return
	}
	restored, err := store.Restore(ctx, path, rank.SegmentName(rank.LocalJobID(), "store.example-restored"), store.WithSpec(spec))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer restored.Close()
	for st := range restored.Rows() {
		v, _ := restored.Read(st.Ref())
		x, _ := store.Block[int64](v, 0)
		fmt.Println(st.Seq, st.Priority, x)
		v.Done()
	}
	// Output:
	// 0 0 [0]
	// 1 1 [1]
	// 2 2 [4]
}
