package cuda_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/cuda/cudatest"
)

func ExampleWeightedSampleCPU() {
	weights := []float32{0, 1, 3} // index 0 is never chosen
	draws := []float64{0.1, 0.3, 0.9}
	out := make([]int64, len(draws))
	if err := cuda.WeightedSampleCPU(weights, draws, out); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(out)
	// Output: [1 2 2]
}

func ExampleTopKCPU() {
	priorities := []float64{0.5, 2, 2, -1, 7}
	top := make([]int64, 3)
	if err := cuda.TopKCPU(priorities, 3, top); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(top) // ties go to the smaller index
	// Output: [4 1 2]
}

// Selecting on the GPU when there is one, and on the CPU otherwise, with the
// same result either way.
func Example() {
	ctx := context.Background()
	weights := []float32{0.5, 0, 2, 1.5}
	draws := cuda.UniformDraws(7, 4) // seeded: the same on every rank
	picked := make([]int64, len(draws))

	drv, err := cuda.OpenDriver()
	if errors.Is(err, cuda.ErrNoDriver) {
		err = cuda.WeightedSampleCPU(weights, draws, picked)
		fmt.Println(picked, err)
		return
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	dev, err := drv.Device(0)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()
	buf, err := dev.Alloc(4 * len(weights))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Free(buf)
	if err := dev.CopyHtoD(buf, cudatest.Bytes(weights)); err != nil {
		fmt.Println(err)
		return
	}
	s, err := dev.NewSampler()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	err = s.WeightedSample(ctx, 0, buf, len(weights), cuda.Float32, draws, picked)
	fmt.Println(picked, err)
}
