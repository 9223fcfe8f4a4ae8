package jobs

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gear-rl/gear/gmi"
	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
)

// PlanOption adjusts Request and Plan.
type PlanOption func(*planConfig)

type planConfig struct {
	topo *gmi.Topology
}

// WithTopology places the ranks that need GPUs on topo instead of the
// machine that gmi.Discover finds (NVML, or the GEAR_TOPOLOGY file).
func WithTopology(topo *gmi.Topology) PlanOption {
	return func(c *planConfig) { c.topo = topo }
}

// Request turns a validated spec into the launcher's request for a run on this
// machine: one launch group per role, [launch].env for every rank and each
// group's env for its ranks, the rendezvous timeout, and for each role with
// gpus_per_rank a GPU binding request (see gpuRequest) that launch.NewPlan
// plans with gmi.NewPlan, as gearrun's --bind and --gmi-per-gpu do. Every rank
// gets GEAR_JOB_SPEC, the absolute path of specPath ("" leaves it out), so
// that it can read the spec with FromEnv. Only a spec with gpus_per_rank looks
// for GPUs (gmi.Discover under ctx, unless WithTopology gives them).
func (s *Spec) Request(ctx context.Context, specPath string, opts ...PlanOption) (launch.Request, error) {
	var cfg planConfig
	for _, o := range opts {
		o(&cfg)
	}
	req := launch.Request{
		RdzvTimeout:       s.Launch.RdzvTimeout.D(),
		HeartbeatInterval: s.Launch.Heartbeat.D(),
		HeartbeatTimeout:  s.Launch.HeartbeatTimeout.D(),
		Env:               envList(s.Launch.Env),
		NoTorchEnv:        !s.Launch.TorchEnvOn(),
		MaxRestarts:       s.Launch.Restarts,
		CheckpointDir:     s.Launch.CheckpointDir,
	}
	if specPath != "" {
		abs, err := filepath.Abs(specPath)
		if err != nil {
			return launch.Request{}, fmt.Errorf("jobs: %w", err)
		}
		req.Env = append(req.Env, rank.EnvJobSpec+"="+abs)
	}
	binds := false
	for i, ro := range s.Roles() {
		g := launch.Group{Role: ro.Name, NP: ro.NP, Argv: ro.Command, Bind: s.gpuRequest(ro)}
		if len(s.Groups) > 0 {
			g.Env = envList(s.Groups[i].Env)
		} else {
			g.MinNP = s.Launch.MinNP
		}
		binds = binds || g.Bind != nil
		req.Groups = append(req.Groups, g)
	}
	if binds {
		req.Topology = cfg.topo
		if req.Topology == nil {
			topo, err := gmi.Discover(ctx)
			if err != nil {
				return launch.Request{}, fmt.Errorf("jobs: %w", err)
			}
			req.Topology = topo
		}
	}
	return req, nil
}

// envList turns a map into sorted NAME=VALUE entries.
func envList(m map[string]string) []string {
	var out []string
	for _, k := range sortedKeys(m) {
		out = append(out, k+"="+m[k])
	}
	return out
}

// gpuRequest is the GPU binding of a role's ranks, nil for a role without
// gpus_per_rank: with gpus_per_rank G > 1, G whole GPUs per rank; with 1,
// [gmi].per_gpu ranks per GPU through [gmi].backend. launch.BindGPUs places
// it, group after group on distinct GPUs, with gmi.NewPlan.
func (s *Spec) gpuRequest(ro Role) *gmi.PlanRequest {
	if ro.GPUsPerRank <= 0 {
		return nil
	}
	req := &gmi.PlanRequest{Backend: gmi.Backend(s.GMI.Backend)}
	if ro.GPUsPerRank > 1 {
		req.GPUsPerRank = ro.GPUsPerRank
	} else {
		req.GMIPerGPU = s.GMI.PerGPU
	}
	return req
}

// taskBinding returns the GPU binding variables of the SLURM task info (none
// when its role has no gpus_per_rank). Tasks sit on nodes in blocks, so the
// node holds world ranks Rank-LocalRank to Rank-LocalRank+LocalSize-1; each
// role's ranks among them are planned on the node's GPUs by launch.BindGPUs,
// role after role, exactly as a local run plans a whole job. The node's GPUs
// are the topology that gmi.Discover finds (NVML, or GEAR_TOPOLOGY as lookup
// gives it), restricted to the CUDA_VISIBLE_DEVICES that SLURM set. The
// GMI layout a rank gets lists its role's ranks on its node.
func (s *Spec) taskBinding(ctx context.Context, info rank.Info, lookup func(string) (string, bool)) (map[string]string, error) {
	if ro, _, _ := s.RoleOf(info.Rank); ro.GPUsPerRank <= 0 {
		return nil, nil
	}
	getenv := func(k string) string { v, _ := lookup(k); return v }
	topo, err := gmi.Discover(ctx, gmi.WithGetenv(getenv))
	if err != nil {
		return nil, err
	}
	first, last := info.Rank-info.LocalRank, info.Rank-info.LocalRank+info.LocalSize
	var groups []launch.GPUGroup
	for i, ro := range s.Roles() {
		req := s.gpuRequest(ro)
		lo, hi := max(ro.FirstRank, first), min(ro.FirstRank+ro.NP, last)
		if req == nil || lo >= hi {
			continue
		}
		groups = append(groups, launch.GPUGroup{Group: i, Role: ro.Name, FirstRank: lo, NP: hi - lo, Req: *req})
	}
	_, devs, err := launch.BindGPUs(topo, getenv(rank.EnvCUDAVisibleDevices), groups)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for _, kv := range devs[info.Rank].Environ() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env, nil
}

// Plan makes the launch plan of a validated spec for a run on this machine:
// launch.NewPlan of Request(ctx, specPath, opts...). A binding that does not
// fit the machine is a *launch.BindError.
func (s *Spec) Plan(ctx context.Context, specPath string, opts ...PlanOption) (*launch.Plan, error) {
	req, err := s.Request(ctx, specPath, opts...)
	if err != nil {
		return nil, err
	}
	p, err := launch.NewPlan(req)
	if err != nil {
		return nil, fmt.Errorf("jobs: %w", err)
	}
	if p.CheckpointDir == "" && p.MaxRestarts > 0 {
		p.CheckpointDir = launch.CheckpointDir("", p.JobID)
	}
	return p, nil
}

// Options are the launcher's options from [launch]: timeout, grace and
// output_dir, with output lines tagged by rank. The caller adds its streams and
// signals.
func (s *Spec) Options() launch.Options {
	return launch.Options{
		Timeout:   s.Launch.Timeout.D(),
		Grace:     s.Launch.Grace.D(),
		OutputDir: s.Launch.OutputDir,
		Trace:     s.Launch.Trace,
		TagOutput: true,
		Name:      "gearrun",
	}
}
