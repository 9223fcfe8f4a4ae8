package roles_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/roles"
)

func ExamplePlan() {
	// Ranks 0-1 are policy workers, 2-6 actors, 7 the trainer.
	table := roles.Table{"policy": {0, 1}, "actor": {2, 3, 4, 5, 6}, "trainer": {7}}
	plan, err := roles.Plan(table, roles.DefaultNames)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, a := range plan.Actors {
		p, _ := plan.PolicyOf(a)
		tr, _ := plan.TrainerOf(a)
		fmt.Printf("actor %d: policy worker %d, trainer %d\n", a, p, tr)
	}
	fmt.Println("policy worker 1 serves", plan.ClientsOf(1))
	fmt.Println("publisher", plan.Publisher, "readers", plan.ParamReaders)
	// Output:
	// actor 2: policy worker 0, trainer 7
	// actor 3: policy worker 1, trainer 7
	// actor 4: policy worker 0, trainer 7
	// actor 5: policy worker 1, trainer 7
	// actor 6: policy worker 0, trainer 7
	// policy worker 1 serves [3 5]
	// publisher 7 readers [0 1]
}

// An SRL job in one process: a trainer publishes parameters and receives
// samples, a policy worker answers an actor's observations, and the actor pushes
// its trajectory with the parameter version it was served with.
func Example() {
	ctx := context.Background()
	world := collectivetest.NewWorld(3) // 0 trainer, 1 policy worker, 2 actor
	var wg sync.WaitGroup

	// Trainer.
	pub, _ := roles.NewPublisher(ctx, world.Bootstrap(0), "theta", 2)
	defer pub.Close()
	pub.Publish(ctx, 1, []float32{0.5, 2})
	recv, _ := roles.NewSampleReceiver(ctx, world.Bootstrap(0), "traj", roles.SampleConfig{MaxRecordBytes: 1024})
	defer recv.Close()

	// Policy worker: act = obs * theta[1], one batch.
	srv, _ := roles.NewInferenceServer(ctx, world.Bootstrap(1), "pi", roles.InferenceConfig{ObsBytes: 4, ActBytes: 4})
	defer srv.Close()
	wg.Go(func() {
		params, _ := roles.NewReader(ctx, world.Bootstrap(1), "theta", 10)
		defer params.Close()
		params.Wait(ctx, 1)
		b, _ := srv.Next(ctx)
		acts := make([]byte, 4*b.Len())
		for i := range b.Len() {
			for j, o := range b.Obs(i) {
				acts[4*i+j] = o * byte(params.Params()[1])
			}
		}
		b.Reply(acts, params.Version())
	})

	// Actor.
	c, _ := roles.DialInference(ctx, world.Bootstrap(2), "pi", 1)
	defer c.Close()
	act := make([]byte, 4)
	version, err := c.Infer(ctx, []byte{1, 2, 3, 4}, act)
	fmt.Println("action", act, "from version", version, err)
	s, _ := roles.DialSamples(ctx, world.Bootstrap(2), "traj", 0)
	defer s.Close()
	s.Push(ctx, roles.Record{Version: version, Data: []byte("obs,act,reward")})

	rec, _ := recv.Recv(ctx)
	fmt.Printf("trainer got %q from actor %d, version %d\n", rec.Data, rec.Actor, rec.Version)
	wg.Wait()
	// Output:
	// action [2 4 6 8] from version 1 <nil>
	// trainer got "obs,act,reward" from actor 2, version 1
}
