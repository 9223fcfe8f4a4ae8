package launch

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gear-rl/gear/rank"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

func noGo(string) bool { return false }

func TestNewPlanAssignsRanksAndRoles(t *testing.T) {
	p, err := NewPlan(Request{
		JobID: "job-1", Token: "secret", IsGoPackage: noGo,
		Groups: []Group{
			{NP: 2, Argv: []string{"./bin/actor", "--fast"}},
			{NP: 1, Argv: []string{"/opt/trainer.py"}},
			{NP: 1, Role: "actor", Argv: []string{"./bin/actor", "--slow"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if p.Size() != 4 || p.RdzvAddr != "127.0.0.1:0" || time.Duration(p.RdzvTimeout) != rank.DefaultRdzvTimeout {
		t.Fatalf("plan %+v", p)
	}
	type rr struct {
		role      string
		roleRank  int
		local, ls int
	}
	want := []rr{{"actor", 0, 0, 4}, {"actor", 1, 1, 4}, {"trainer", 0, 2, 4}, {"actor", 2, 3, 4}}
	for i, r := range p.Ranks {
		if got := (rr{r.Role, r.RoleRank, r.LocalRank, r.LocalSize}); got != want[i] || r.Rank != i {
			t.Errorf("rank %d: %+v, want %+v", i, got, want[i])
		}
	}
	if len(p.Roles) != 2 || !slices.Equal(p.Roles[0].Ranks, []int{0, 1, 3}) || !slices.Equal(p.Roles[1].Ranks, []int{2}) {
		t.Fatalf("roles %+v", p.Roles)
	}
}

func TestRoleNames(t *testing.T) {
	for _, c := range []struct {
		groups []Group
		want   []string
	}{
		{[]Group{{NP: 1, Argv: []string{"./hello"}}}, []string{""}},
		{[]Group{{NP: 1, Role: "solo", Argv: []string{"./hello"}}}, []string{"solo"}},
		{[]Group{{NP: 1, Argv: []string{"./w"}}, {NP: 1, Argv: []string{"/x/w"}}}, []string{"group0", "group1"}},
		{[]Group{{NP: 1, Argv: []string{"./w"}}, {NP: 1, Role: "w", Argv: []string{"./v"}}}, []string{"w", "w"}},
		{[]Group{{NP: 1, Argv: []string{"./a.py"}}, {NP: 1, Argv: []string{"b"}}}, []string{"a", "b"}},
	} {
		if got := groupRoles(c.groups); !slices.Equal(got, c.want) {
			t.Errorf("groupRoles(%v) = %q, want %q", c.groups, got, c.want)
		}
	}
}

func TestNewPlanErrorsNameTheGroup(t *testing.T) {
	for _, c := range []struct {
		req  Request
		want string
	}{
		{Request{}, "no program"},
		{Request{Groups: []Group{{NP: 0, Argv: []string{"a"}}}}, "group 0: -np 0"},
		{Request{Groups: []Group{{NP: 1, Argv: []string{"a"}}, {NP: 1}}}, "group 1: no program"},
		{Request{JobID: "a/b", Groups: []Group{{NP: 1, Argv: []string{"a"}}}}, "job ID"},
		{Request{Env: []string{"=x"}, Groups: []Group{{NP: 1, Argv: []string{"a"}}}}, `env "=x"`},
		{Request{Groups: []Group{{NP: 1, Argv: []string{"a"}}}, Binder: BinderFunc(func(r RankSpec) (Device, error) {
			return Device{}, errors.New("no GPU left")
		})}, "rank 0: device binding: no GPU left"},
	} {
		c.req.IsGoPackage = noGo
		_, err := NewPlan(c.req)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.req, err, c.want)
		}
	}
}

func TestEnvironAndBinding(t *testing.T) {
	p, err := NewPlan(Request{
		JobID: "job-1", Token: "secret", IsGoPackage: noGo,
		Env:    []string{"A=1", "FROM_LAUNCHER", "UNSET_ONE"},
		Lookup: func(k string) (string, bool) { return "v", k == "FROM_LAUNCHER" },
		Groups: []Group{{NP: 2, Argv: []string{"prog"}, Env: []string{"A=2"}}},
		Binder: BinderFunc(func(r RankSpec) (Device, error) {
			return Device{VisibleDevices: []string{"0", "MIG-abc"}[r.Rank], MPSThreadPercent: 50 * r.Rank}, nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	env := p.Environ(1, "127.0.0.1:999")
	for _, kv := range []string{"GEAR_RANK=1", "GEAR_WORLD_SIZE=2", "GEAR_RDZV_ADDR=127.0.0.1:999", "GEAR_JOB_ID=job-1",
		"GEAR_JOB_TOKEN=secret", "GEAR_ROLE=", "GEAR_ROLE_RANK=1", "GEAR_LOCAL_RANK=1", "GEAR_LOCAL_SIZE=2",
		"GEAR_NODE_RANK=0", "GEAR_NUM_NODES=1", "CUDA_VISIBLE_DEVICES=MIG-abc",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "FROM_LAUNCHER=v"} {
		if !slices.Contains(env, kv) {
			t.Errorf("environ lacks %s: %v", kv, env)
		}
	}
	merged := rank.MergeEnv([]string{"GEAR_RANK=7", "PATH=/bin", "A=0"}, env)
	if slices.Contains(merged, "GEAR_RANK=7") || !slices.Contains(merged, "PATH=/bin") || !slices.Contains(merged, "A=2") || slices.Contains(merged, "A=1") {
		t.Fatalf("merged %v", merged)
	}
	for _, kv := range env {
		if strings.HasPrefix(kv, "UNSET_ONE") {
			t.Fatal("-x of an unset variable passed something")
		}
	}
	// The plan reads back from JSON as it was.
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var q Plan
	if err := json.Unmarshal(b, &q); err != nil {
		t.Fatal(err)
	}
	if q.RdzvTimeout != p.RdzvTimeout || q.Ranks[1].Device != p.Ranks[1].Device || q.Token != "secret" {
		t.Fatalf("JSON round trip: %+v", q)
	}
}

func TestDryRunGolden(t *testing.T) {
	p, err := NewPlan(Request{
		JobID: "job-1", Token: "secret", RdzvTimeout: 30 * time.Second, IsGoPackage: func(s string) bool { return s == "./examples/hello" },
		Env:    []string{"OMP_NUM_THREADS=1"},
		Groups: []Group{{NP: 2, Argv: []string{"./examples/hello"}}, {NP: 1, Role: "learner", Argv: []string{"python3", "-c", "print('hi there')"}, Env: []string{"B=2"}}},
		Binder: BinderFunc(func(r RankSpec) (Device, error) {
			return Device{VisibleDevices: "0", MPSThreadPercent: 33, MPSPinnedMemLimit: "0=2G"}, nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		file  string
		write func(*bytes.Buffer) error
	}{
		{"plan.txt", func(b *bytes.Buffer) error { return p.WriteText(b) }},
		{"plan.json", func(b *bytes.Buffer) error { return p.WriteJSON(b) }},
	} {
		var b bytes.Buffer
		if err := c.write(&b); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(b.String(), "secret") {
			t.Fatalf("%s shows the token:\n%s", c.file, b.String())
		}
		path := filepath.Join("testdata", c.file)
		if *update {
			os.WriteFile(path, b.Bytes(), 0o644)
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if b.String() != string(want) {
			t.Errorf("%s differs from %s (run with -update to accept):\n%s", c.file, path, b.String())
		}
	}
}
