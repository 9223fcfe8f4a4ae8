package gmi_test

import (
	"fmt"
	"os"

	"github.com/gear-rl/gear/gmi"
)

func ExampleChooseStrategy() {
	for _, m := range []gmi.Mapping{
		{{0, 1, 2}},
		{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}},
		{{0, 1, 2}, {3, 4, 5}},
		{{0, 1}, {2, 3, 4}},
	} {
		fmt.Println(m, gmi.ChooseStrategy(m))
	}
	// Output:
	// [[0,1,2]] multi-process
	// [[0,1,2],[3,4,5],[6,7,8]] multi-ring
	// [[0,1,2],[3,4,5]] hierarchical
	// [[0,1],[2,3,4]] hierarchical
}

func ExampleReductionSchedule() {
	m, _ := gmi.ParseMapping("[[0,1],[2,3],[4,5]]")
	sc, _ := gmi.ReductionSchedule(m, gmi.ChooseStrategy(m))
	sc.WriteText(os.Stdout)
	for _, st := range sc.ForRank(3) {
		fmt.Println("rank 3:", st.Phase, st.Op, st.Group.Ranks)
	}
	// Output:
	// multi-ring on [[0,1],[2,3],[4,5]]
	//   1  rings           reduce     nccl  {0,2,4}->0 {1,3,5}->3
	//   2  ring-ends       allreduce  nccl  {0,3}
	//   3  ring-broadcast  broadcast  nccl  0->{0,2,4} 3->{1,3,5}
	// rank 3: rings reduce [1 3 5]
	// rank 3: ring-ends allreduce [0 3]
	// rank 3: ring-broadcast broadcast [1 3 5]
}

func ExampleNewPlan() {
	topo, err := gmi.ParseTopology("two-v100.toml", []byte(`
[mps]
running = true
[[gpu]]
name = "Tesla V100-SXM2-32GB"
compute_capability = "7.0"
[[gpu]]
name = "Tesla V100-SXM2-32GB"
compute_capability = "7.0"
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	p, err := gmi.NewPlan(topo, gmi.PlanRequest{Ranks: 4, GMIPerGPU: 2})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(p.Backend, p.Mapping, p.Strategy)
	fmt.Println(p.Bindings[3].Environ())
	// Output:
	// mps [[0,1],[2,3]] multi-ring
	// [CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 CUDA_VISIBLE_DEVICES=1 GEAR_GMI_LAYOUT=[[0,1],[2,3]]]
}
