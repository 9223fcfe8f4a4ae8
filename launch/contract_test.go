package launch

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gear-rl/gear/gmi"
	"github.com/gear-rl/gear/rank"
)

// decodeRankEnv reads a rank's environment ("NAME=value" entries; of several
// of one name the last wins, as exec does with MergeEnv's output) back with
// rank.FromLookup.
func decodeRankEnv(t *testing.T, env []string) rank.Info {
	t.Helper()
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	info, err := rank.FromLookup(func(k string) (string, bool) { v, ok := m[k]; return v, ok })
	if err != nil {
		t.Fatalf("rank.FromLookup: %v\n%q", err, env)
	}
	return info
}

// checkLauncherNames fails for a GEAR_* or device variable in env that
// rank.LauncherEnv does not list: the launcher sets no name outside the one
// list that a job spec's validation refuses.
func checkLauncherNames(t *testing.T, env []string) {
	t.Helper()
	listed := rank.LauncherEnv()
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if (strings.HasPrefix(name, "GEAR_") || strings.HasPrefix(name, "CUDA_")) && !slices.Contains(listed, name) {
			t.Errorf("the launcher sets %s, which rank.LauncherEnv does not list", name)
		}
	}
}

// Every rank of a plan on hosts, a later generation with a checkpoint
// directory, decodes its environment to the place the plan gives it, whatever
// place the launcher itself had.
func TestEnvironDecodesToPlan(t *testing.T) {
	p := placedPlan(t, "h1:2,h2:2", Request{
		JobID: "11111111-2222-3333-4444-555555555555", Token: "secret",
		RdzvAddr: "10.0.0.1:7000", RdzvTimeout: 17 * time.Second,
		MaxRestarts: 3, CheckpointDir: "/ckpt/j", IsGoPackage: noGo,
		Groups: []Group{
			{NP: 1, Role: "trainer", Argv: []string{"t"}},
			{NP: 3, Role: "actor", Argv: []string{"a"}},
		},
	})
	p.Restart = 2
	var parent []string // a launcher that is itself rank 9 of another job
	for _, name := range rank.LauncherEnv() {
		parent = append(parent, name+"=9")
	}
	for r, s := range p.Ranks {
		want := rank.Info{
			Rank: r, Size: 4, LocalRank: r % 2, LocalSize: 2, NodeRank: r / 2, NumNodes: 2,
			Role: []string{"trainer", "actor", "actor", "actor"}[r], RoleRank: []int{0, 0, 1, 2}[r],
			RdzvAddr: "10.0.0.1:7001", RdzvTimeout: 17 * time.Second,
			JobID: "11111111-2222-3333-4444-555555555555", Token: "secret",
			Restart: 2, CheckpointDir: "/ckpt/j", Source: rank.SourceGear,
		}
		env := p.Environ(r, "10.0.0.1:7001")
		if got := decodeRankEnv(t, env); got != want {
			t.Errorf("rank %d reads\n %#v\nwant %#v", r, got, want)
		}
		if got := decodeRankEnv(t, rank.MergeEnv(parent, env)); got != want {
			t.Errorf("rank %d under a launcher with a place of its own reads\n %#v\nwant %#v", r, got, want)
		}
		if !slices.Contains(env, rank.EnvNodeName+"="+s.Host) || s.Host == "" {
			t.Errorf("rank %d on host %q: no %s in %q", r, s.Host, rank.EnvNodeName, env)
		}
		checkLauncherNames(t, env)
	}
}

// A rank bound to a GPU gets the device variables that rank.DeviceEnv lists,
// and inherits none of them from the launcher (inheritDrop).
func TestDeviceEnvIsTheBinding(t *testing.T) {
	p := bindPlan(t, Request{
		Topology: topology(t, "a100-2x.toml"),
		Groups:   []Group{{NP: 4, Argv: []string{"prog"}, Bind: &gmi.PlanRequest{GMIPerGPU: 2, MPSMemLimitEven: true}}},
	})
	env := p.Environ(1, "127.0.0.1:1")
	checkLauncherNames(t, env)
	var names []string
	for _, kv := range p.Ranks[1].Device.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		names = append(names, name)
	}
	if !slices.Equal(names, rank.DeviceEnv()) {
		t.Errorf("an MPS share sets %q, rank.DeviceEnv lists %q", names, rank.DeviceEnv())
	}
	if drop := p.inheritDrop(1); !slices.Equal(drop, rank.DeviceEnv()) {
		t.Errorf("a bound rank drops %q from the launcher's environment, rank.DeviceEnv lists %q", drop, rank.DeviceEnv())
	}
	if got := decodeRankEnv(t, env); got.Rank != 1 || got.Size != 4 {
		t.Errorf("bound rank 1 reads %v", got)
	}
}
