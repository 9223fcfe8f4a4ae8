package dist

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/examples/dqn/nn"
	"github.com/gear-rl/gear/roles"
)

// errRunOver ends a policy worker's wait for requests when the trainers
// ended the run.
var errRunOver = errors.New("dist: the trainers ended the run")

// policy runs a policy worker: it answers its actors' observations in
// batches with the greedy actions of the newest parameters it has (taken at
// most every ParamEvery batches), and the version of those parameters. It
// ends when the trainers end the run.
func (r *rankRun) policy(ctx context.Context) error {
	cfg := r.cfg
	a := cfg.Agent
	env := r.hooks.Env()
	obsSize, numActions := env.ObsSize(), env.NumActions()
	clients := r.plan.ClientsOf(r.me)
	k := cfg.EnvsPerActor
	maxBatch := cfg.InferBatch // in observations
	if maxBatch == 0 {
		maxBatch = max(1, len(clients)) * k
	}

	theta, err := roles.NewReader(ctx, r.b, thetaName, cfg.ParamEvery, r.opts...)
	if err != nil {
		return err
	}
	defer theta.Close()
	if _, err := theta.Wait(ctx, 1); err != nil {
		return r.actorEnd(err)
	}
	net := nn.NewMLP(agent.LayerSizes(a, obsSize, numActions), maxBatch, r.rng(3))
	if err := net.SetParams(theta.Params()); err != nil {
		return err
	}
	srv, err := roles.NewInferenceServer(ctx, r.b, inferName, roles.InferenceConfig{
		MaxBatch: maxBatch, MaxDelay: cfg.InferDelay, ObsBytes: 4 * obsSize, ActBytes: 4,
		MaxRequestObs: k, Slots: max(64, len(clients)),
	}, r.opts...)
	if err != nil {
		return err
	}
	defer srv.Close()

	// A watcher ends the wait for requests when the run is over: the trainer's
	// status says stop, or it closed its status service.
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	statusR, err := roles.NewReader(ctx, r.b, statusName(r.plan.Publisher), 1, r.opts...)
	if err != nil {
		return err
	}
	watchDone := make(chan error, 1)
	go func() {
		defer statusR.Close()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			_, err := statusR.Latest(ctx)
			if err == nil && statusR.Version() > 0 {
				var s status
				if s, err = decodeStatus(statusR.Params()); err == nil && s.Stop {
					err = errRunOver
				}
			}
			if err != nil {
				if endedByPeer(err) {
					err = errRunOver
				}
				stop(err)
				watchDone <- err
				return
			}
			select {
			case <-ctx.Done():
				watchDone <- nil
				return
			case <-tick.C:
			}
		}
	}()
	defer func() {
		stop(nil)
		<-watchDone
	}()
	r.hooks.Logf("policy worker %d: rank %d, pid %d, serving %s of %s each, batches of up to %d observations, waits paced by the actors and at most %v",
		slices.Index(r.plan.Policies, r.me), r.me, pid, plural(len(clients), "actor"), plural(k, "environment"), maxBatch, cfg.InferDelay)
	defer func() {
		st := srv.Stats()
		if st.Batches > 0 {
			r.hooks.Logf("policy worker: %d batches of %d requests and %d observations (%.1f and %.1f a batch); out when full %d, all in %d, paced %d, at the deadline %d",
				st.Batches, st.Requests, st.Observations, float64(st.Requests)/float64(st.Batches), float64(st.Observations)/float64(st.Batches),
				st.Full, st.AllIn, st.Paced, st.MaxDelay)
		}
	}()

	// The observations are read where the actors wrote them (their
	// shared-memory slots) into the network's input, and the actions written
	// straight into the slots.
	obs := make([]float32, maxBatch*obsSize)
	for step := int64(0); ; step++ {
		b, err := srv.Next(ctx)
		if err != nil {
			return r.policyEnd(ctx, err)
		}
		fresh, err := theta.MaybeRefresh(ctx, step)
		if err != nil {
			return r.policyEnd(ctx, err)
		}
		if fresh {
			if err := net.SetParams(theta.Params()); err != nil {
				return err
			}
		}
		n := b.Len()
		for i := range n {
			row := obs[i*obsSize : (i+1)*obsSize]
			o := b.Obs(i)
			if len(o) != 4*obsSize {
				clear(row)
				o = o[:min(len(o), 4*obsSize)&^3]
			}
			floats(row[:len(o)/4], o)
		}
		q := net.Forward(obs[:n*obsSize], n)
		for i := range n {
			binary.LittleEndian.PutUint32(b.Action(i), uint32(agent.Argmax(q[i*numActions:(i+1)*numActions])))
		}
		if err := b.Send(theta.Version()); err != nil {
			return r.policyEnd(ctx, err)
		}
	}
}

// policyEnd maps the error that ended a policy worker's loop: the end of the
// run is no error.
func (r *rankRun) policyEnd(ctx context.Context, err error) error {
	if errors.Is(context.Cause(ctx), errRunOver) || endedByPeer(err) {
		return nil
	}
	if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil && !errors.Is(err, cause) {
		return fmt.Errorf("%w (%v)", err, cause)
	}
	return err
}
