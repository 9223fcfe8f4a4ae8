package sample_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/sample"
	"github.com/gear-rl/gear/store"
)

// Collecting into device memory where there is a GPU, and into host memory
// where there is none.
func ExampleShardTable_CollectDevice() {
	ctx := context.Background()
	sh, err := store.Create("gear.example.store.0", store.Spec{Capacity: 64, Remover: store.RemoverNone,
		Columns: []store.Column{{Name: "obs", DType: store.Float32, Shape: []int{84, 84}, Length: 8}}})
	if err != nil {
		panic(err)
	}
	defer sh.Close()
	st, err := sample.NewShardTable(sh, sample.Config{Name: "replay", Sampler: sample.NewUniform(), Remover: sample.NewFIFO()})
	if err != nil {
		panic(err)
	}
	defer st.Close() // before the device: it unregisters the shard's tables
	// ... writers insert trajectories; a batch is sampled ...
	indices := []int{3, 1, 4}
	w := sample.Window{Offset: 2, Length: 4, Pad: sample.PadTail}

	dev, err := sample.OpenDevice(0)
	if errors.Is(err, cuda.ErrNoDriver) {
		bufs, err := st.Collect(ctx, indices, []string{"obs"}, w) // the host path
		fmt.Println(len(bufs), err)
		return
	}
	if err != nil {
		panic(err)
	}
	defer dev.Close()
	if err := st.RegisterDevice(ctx, dev); err != nil {
		panic(err)
	}
	sizes, _ := st.ItemBytes([]string{"obs"}, w)
	dst, err := dev.Alloc(len(indices) * sizes[0])
	if err != nil {
		panic(err)
	}
	defer dev.Free(dst)
	s, err := dev.NewStream()
	if err != nil {
		panic(err)
	}
	defer dev.DestroyStream(s)
	// dst holds the three windows, zero frames included, when this returns.
	err = st.CollectDevice(ctx, s, []cuda.DevicePtr{dst}, indices, []string{"obs"}, w)
	fmt.Println(err)
}

// A prioritized table whose draws run with the selection kernels' CPU twins
// (NewDeviceSelection(dev) runs them on a GPU and picks the same). With exact
// weights they also pick what the sum tree picks.
func ExampleDeviceSelection() {
	ctx := context.Background()
	sel := sample.NewTwinSelection()
	defer sel.Close()
	keys := func(s *sample.DeviceSelection) []uint64 {
		p, _ := sample.NewPrioritized(1)
		t, _ := sample.NewTable(sample.Config{Name: "prio", MaxSize: 100, Sampler: p, Remover: sample.NewFIFO(),
			Seed: 42, Selection: s})
		defer t.Close()
		for k := range uint64(10) {
			_ = t.Insert(ctx, k, float64(k%4), k)
		}
		batch, _ := t.Sample(ctx, 8)
		var out []uint64
		for _, x := range batch {
			out = append(out, x.Key)
		}
		return out
	}
	fmt.Println(keys(sel))
	fmt.Println(keys(nil))
	// Output:
	// [7 9 3 9 3 7 9 7]
	// [7 9 3 9 3 7 9 7]
}
