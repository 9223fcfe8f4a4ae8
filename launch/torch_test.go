package launch

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/gear-rl/gear/internal/geartest"
)

// rankEnvs runs p with every rank printing its environment, and returns each
// rank's variables.
func rankEnvs(t *testing.T, p *Plan, base []string) ([]map[string]string, *Result) {
	t.Helper()
	var out, errw geartest.Buffer
	opts := testOptions(t, &out, &errw)
	opts.BaseEnv = base
	res, err := Run(context.Background(), p, opts)
	if err != nil {
		t.Fatalf("%v\n%s", err, errw.String())
	}
	envs := make([]map[string]string, p.Size())
	for i := range envs {
		envs[i] = map[string]string{}
	}
	for _, line := range strings.Split(out.String(), "\n") {
		tag, kv, ok := strings.Cut(line, "] ")
		if !ok {
			continue
		}
		r, err := strconv.Atoi(strings.TrimPrefix(tag, "["))
		if k, v, ok := strings.Cut(kv, "="); ok && err == nil {
			envs[r][k] = v
		}
	}
	return envs, res
}

func TestRunSetsTorchrunsVariables(t *testing.T) {
	p, err := NewPlan(Request{IsGoPackage: noGo, Groups: []Group{
		{NP: 2, Role: "actor", Argv: []string{"env"}},
		{NP: 1, Role: "learner", Argv: []string{"env"}, Env: []string{"MASTER_ADDR=10.9.9.9"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	envs, res := rankEnvs(t, p, []string{"PATH=/usr/bin:/bin", "RANK=77", "LOCAL_RANK=77"})
	_, rdzvPort, _ := net.SplitHostPort(res.RdzvAddr)
	host, port, err := net.SplitHostPort(res.MasterAddr)
	if err != nil || host != "127.0.0.1" || port == "" || port == "0" {
		t.Fatalf("Result.MasterAddr = %q, want 127.0.0.1 and a port", res.MasterAddr)
	}
	if port == rdzvPort {
		t.Fatalf("MASTER_PORT %s is the rendezvous port", port)
	}
	for r, role := range []struct {
		name       string
		rank, size int
	}{{"actor", 0, 2}, {"actor", 1, 2}, {"learner", 0, 1}} {
		want := map[string]string{
			"RANK": strconv.Itoa(r), "WORLD_SIZE": "3", "LOCAL_RANK": strconv.Itoa(r), "LOCAL_WORLD_SIZE": "3",
			"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_NAME": role.name,
			"ROLE_RANK": strconv.Itoa(role.rank), "ROLE_WORLD_SIZE": strconv.Itoa(role.size),
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "TORCHELASTIC_RESTART_COUNT": "0",
			"TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": p.JobID, "OMP_NUM_THREADS": "1",
		}
		if r == 2 {
			want["MASTER_ADDR"] = "10.9.9.9" // the group's own env wins
		}
		for k, v := range want {
			if envs[r][k] != v {
				t.Errorf("rank %d: %s=%q, want %q", r, k, envs[r][k], v)
			}
		}
	}
}

func TestRunTorchEnvOff(t *testing.T) {
	p, err := NewPlan(Request{IsGoPackage: noGo, NoTorchEnv: true, Groups: []Group{{NP: 2, Argv: []string{"env"}}}})
	if err != nil {
		t.Fatal(err)
	}
	envs, res := rankEnvs(t, p, []string{"PATH=/usr/bin:/bin", "RANK=77"})
	if res.MasterAddr != "" {
		t.Errorf("Result.MasterAddr = %q without the torch contract", res.MasterAddr)
	}
	for r, env := range envs {
		if env["RANK"] != "77" { // the launcher's own, untouched
			t.Errorf("rank %d: RANK=%q, want the launcher's 77", r, env["RANK"])
		}
		for _, k := range []string{"WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "TORCHELASTIC_RESTART_COUNT"} {
			if v, ok := env[k]; ok {
				t.Errorf("rank %d: %s=%q with the torch contract off", r, k, v)
			}
		}
		if env["GEAR_RANK"] != strconv.Itoa(r) {
			t.Errorf("rank %d: GEAR_RANK=%q", r, env["GEAR_RANK"])
		}
	}
}

// OMP_NUM_THREADS=1 is a default: the launcher's own value wins, and a rank
// alone on its node gets none.
func TestRunTorchOMPDefault(t *testing.T) {
	two := shPlan(t, 2, "env")
	envs, _ := rankEnvs(t, two, []string{"PATH=/usr/bin:/bin", "OMP_NUM_THREADS=4"})
	for r, env := range envs {
		if env["OMP_NUM_THREADS"] != "4" {
			t.Errorf("rank %d: OMP_NUM_THREADS=%q, want the launcher's 4", r, env["OMP_NUM_THREADS"])
		}
	}
	one := shPlan(t, 1, "env")
	envs, _ = rankEnvs(t, one, []string{"PATH=/usr/bin:/bin"})
	if v, ok := envs[0]["OMP_NUM_THREADS"]; ok {
		t.Errorf("a rank alone on its node got OMP_NUM_THREADS=%q", v)
	}
}

func TestMasterHost(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:0": "127.0.0.1", ":0": "127.0.0.1", "0.0.0.0:5000": "127.0.0.1", "[::]:1": "127.0.0.1",
		"10.1.2.3:29400": "10.1.2.3", "node7:1": "node7", "garbage": "127.0.0.1",
	} {
		if got := masterHost(addr); got != want {
			t.Errorf("masterHost(%q) = %q, want %q", addr, got, want)
		}
	}
}
