package jobs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gear/launch"
	"gear/rank"
)

// Request turns a validated spec into the launcher's request for a run on this
// machine: one launch group per role, [launch].env for every rank and each
// group's env for its ranks, the rendezvous timeout, and a device binder for
// gpus_per_rank and [gmi]. Every rank gets GEAR_JOB_SPEC, the absolute path of
// specPath ("" leaves it out), so that it can read the spec with FromEnv.
// launch.NewPlan makes the plan from it.
func (s *Spec) Request(specPath string) (launch.Request, error) {
	req := launch.Request{
		RdzvTimeout: s.Launch.RdzvTimeout.D(),
		Env:         envList(s.Launch.Env),
	}
	if specPath != "" {
		abs, err := filepath.Abs(specPath)
		if err != nil {
			return launch.Request{}, fmt.Errorf("jobs: %w", err)
		}
		req.Env = append(req.Env, rank.EnvJobSpec+"="+abs)
	}
	for i, ro := range s.Roles() {
		g := launch.Group{Role: ro.Name, NP: ro.NP, Argv: ro.Command}
		if len(s.Groups) > 0 {
			g.Env = envList(s.Groups[i].Env)
		}
		req.Groups = append(req.Groups, g)
	}
	if s.needsGPUs() {
		gpus := visibleGPUs(os.Getenv(rank.EnvCUDAVisibleDevices), 0)
		req.Binder = launch.BinderFunc(func(r launch.RankSpec) (launch.Device, error) {
			return s.bindDevice(r.Rank, r.LocalRank, gpus)
		})
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

func (s *Spec) needsGPUs() bool {
	for _, ro := range s.Roles() {
		if ro.GPUsPerRank > 0 {
			return true
		}
	}
	return false
}

// visibleGPUs lists the GPUs a node offers: the entries of CUDA_VISIBLE_DEVICES
// when set, else 0..n-1; nil (no limit known) when neither says.
func visibleGPUs(visible string, n int) []string {
	if visible != "" && visible != "NoDevFiles" {
		return strings.Split(visible, ",")
	}
	var gpus []string
	for i := range n {
		gpus = append(gpus, strconv.Itoa(i))
	}
	return gpus
}

// bindDevice chooses the GPUs of world rank r, local rank l on its node. Ranks
// are placed on nodes in blocks, so the node's ranks before r are r-l..r-1. With
// gmi.per_gpu = P > 1, local rank l gets GPU l/P and, under MPS, 100/P percent of
// its SMs; otherwise each rank takes the node's next gpus_per_rank GPUs. gpus
// lists the node's GPUs; nil means 0, 1, 2, ... without a known limit. A rank of
// a role without GPUs gets no binding.
func (s *Spec) bindDevice(r, l int, gpus []string) (launch.Device, error) {
	role, _, _ := s.RoleOf(r)
	if role.GPUsPerRank == 0 {
		return launch.Device{}, nil
	}
	gpu := func(i int) (string, error) {
		if gpus == nil {
			return strconv.Itoa(i), nil
		}
		if i >= len(gpus) {
			return "", fmt.Errorf("rank %d needs GPU %d of its node, which has %d", r, i, len(gpus))
		}
		return gpus[i], nil
	}
	if p := s.GMI.PerGPU; p > 1 {
		g, err := gpu(l / p)
		if err != nil {
			return launch.Device{}, err
		}
		d := launch.Device{VisibleDevices: g}
		if s.GMI.Backend == BackendMPS || s.GMI.Backend == BackendAuto {
			d.MPSThreadPercent = 100 / p
		}
		return d, nil
	}
	offset := 0
	for q := r - l; q < r; q++ {
		ro, _, _ := s.RoleOf(q)
		offset += ro.GPUsPerRank
	}
	ids := make([]string, role.GPUsPerRank)
	for i := range ids {
		g, err := gpu(offset + i)
		if err != nil {
			return launch.Device{}, err
		}
		ids[i] = g
	}
	return launch.Device{VisibleDevices: strings.Join(ids, ",")}, nil
}

// deviceEnv is the environment of a binding, as launch sets it.
func deviceEnv(d launch.Device) map[string]string {
	env := map[string]string{}
	if d.VisibleDevices != "" {
		env[rank.EnvCUDAVisibleDevices] = d.VisibleDevices
	}
	if d.MPSThreadPercent > 0 {
		env[rank.EnvMPSThreadPercent] = strconv.Itoa(d.MPSThreadPercent)
	}
	if d.MPSPinnedMemLimit != "" {
		env[rank.EnvMPSPinnedMemLimit] = d.MPSPinnedMemLimit
	}
	return env
}

// Plan makes the launch plan of a validated spec for a run on this machine:
// launch.NewPlan of Request(specPath).
func (s *Spec) Plan(specPath string) (*launch.Plan, error) {
	req, err := s.Request(specPath)
	if err != nil {
		return nil, err
	}
	p, err := launch.NewPlan(req)
	if err != nil {
		return nil, fmt.Errorf("jobs: %w", err)
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
		TagOutput: true,
		Name:      "gearrun",
	}
}
