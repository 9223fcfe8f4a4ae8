package shmname

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The names on disk are those of running jobs and of the tests of collective,
// roles and launch: a change here is a change of the scheme, not a refactor.
func TestNamesOnDisk(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{Name("j1", "dqn.replay.0"), "gear.j1.dqn.replay.0"},
		{Name("j1", ""), "gear.j1."},
		{Make("j1", Coll, "world.r0.0a0b"), "gear.j1.coll.world.r0.0a0b"},
		{Make("j1", Roles, "infer.pi.r2.1234"), "gear.j1.roles.infer.pi.r2.1234"},
		{Make("j1", Store, "replay.0"), "gear.j1.store.replay.0"},
		{Make("j1", Data, "dqn.replay.0"), "gear.j1.dqn.replay.0"},
		{LocalJobID(), "local-" + strconv.Itoa(os.Getpid())},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestKinds(t *testing.T) {
	all := Kinds()
	if len(all) == 0 || all[len(all)-1] != Data {
		t.Fatalf("Kinds() = %q: want Data last", all)
	}
	seen := map[Kind]bool{}
	var gen []string
	for _, k := range all {
		if seen[k] {
			t.Errorf("kind %q listed twice", k)
		}
		seen[k] = true
		if k != Data && (k == "" || strings.ContainsAny(string(k), "./*")) {
			t.Errorf("kind %q: want a non-empty name without '.', '/' or '*'", k)
		}
		if k.PerGeneration() {
			gen = append(gen, k.String())
		}
	}
	// Store shards and other job data outlive a restart; a restarted trainer
	// re-attaches to them (docs/elastic.md).
	if got := strings.Join(gen, " "); got != "coll roles" {
		t.Errorf("per-generation kinds %q, want \"coll roles\"", got)
	}
	all[0] = "changed"
	if Kinds()[0] == "changed" {
		t.Error("Kinds returns the package's own list")
	}
}

// Every kind's name reads back as that kind, with its job and rest.
func TestMakeParse(t *testing.T) {
	for _, k := range Kinds() {
		for _, job := range []string{"j1", "local-42", "slurm-7_1", "0f8e0c1a-6b1e-4e4e-9a3d-1c2b3a4d5e6f"} {
			for _, rest := range []string{"world.r0.0a0b", "0", "x", ""} {
				if k == Data && rest == "" {
					continue
				}
				name := Make(job, k, rest)
				p, ok := Parse(name)
				if !ok || p != (Parts{Job: job, Kind: k, Rest: rest}) {
					t.Errorf("Parse(%q) = %+v, %v; want {%s %q %s}", name, p, ok, job, k, rest)
				}
				if j, ok := Job(name); !ok || j != job {
					t.Errorf("Job(%q) = %q, %v; want %s", name, j, ok, job)
				}
				if !strings.HasPrefix(name, Name(job, "")) {
					t.Errorf("%q does not start with the job's prefix %q", name, Name(job, ""))
				}
			}
		}
	}
}

// Names whose first part only looks like a kind are the job's data.
func TestParseData(t *testing.T) {
	for _, what := range []string{"collector.0", "coll", "rolesx.a", "stores.0", "dqn.replay.0", "", "coll-x.r0"} {
		name := Name("j1", what)
		p, ok := Parse(name)
		if !ok || p != (Parts{Job: "j1", Kind: Data, Rest: what}) {
			t.Errorf("Parse(%q) = %+v, %v; want data %q", name, p, ok, what)
		}
	}
}

func TestParseRefusesForeignNames(t *testing.T) {
	for _, name := range []string{"", "gear", "gear.", "gear..coll.x", "gear.j1", "Gear.j1.coll.x", "nccl.j1.coll.x",
		"sem.gear.j1.x", "gearj1.coll.x", ".gear.j1.x", "pulse-shm-1234", "gear.cu"} {
		if p, ok := Parse(name); ok || p != (Parts{}) {
			t.Errorf("Parse(%q) = %+v, %v; want it refused", name, p, ok)
		}
		if j, ok := Job(name); ok || j != "" {
			t.Errorf("Job(%q) = %q, %v; want it refused", name, j, ok)
		}
	}
}

func TestLocalPID(t *testing.T) {
	if pid, local := LocalPID(LocalJobID()); !local || pid != os.Getpid() {
		t.Errorf("LocalPID(LocalJobID()) = %d, %v; want %d", pid, local, os.Getpid())
	}
	for _, c := range []struct {
		job   string
		pid   int
		local bool
	}{
		{"local-1", 1, true}, {"local-0", 0, true}, {"local--3", 0, true}, {"local-x", 0, true}, {"local-", 0, true},
		{"j1", 0, false}, {"slurm-12", 0, false}, {"Local-12", 0, false}, {"", 0, false},
	} {
		if pid, local := LocalPID(c.job); pid != c.pid || local != c.local {
			t.Errorf("LocalPID(%q) = %d, %v; want %d, %v", c.job, pid, local, c.pid, c.local)
		}
	}
}

func FuzzParseName(f *testing.F) {
	for _, s := range []string{
		"gear.j1.coll.world.r0.0a0b", "gear.j1.roles.infer.pi.r2.1234", "gear.j1.store.0", "gear.j1.dqn.replay.0",
		"gear.j1.collector.0", "gear.j1.coll", "gear.j1.", "gear.j1", "gear..x", "gear.", "", "gear.local-7.coll..",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		p, ok := Parse(name)
		j, jok := Job(name)
		if ok != jok || j != p.Job {
			t.Fatalf("Parse(%q) = %+v, %v but Job = %q, %v", name, p, ok, j, jok)
		}
		if !ok {
			if p != (Parts{}) {
				t.Fatalf("Parse(%q) refused it but returned %+v", name, p)
			}
			return
		}
		if p.Job == "" || strings.Contains(p.Job, ".") {
			t.Fatalf("Parse(%q) returned job %q", name, p.Job)
		}
		if !slices.Contains(Kinds(), p.Kind) {
			t.Fatalf("Parse(%q) returned kind %q, not one of Kinds()", name, p.Kind)
		}
		if again := Make(p.Job, p.Kind, p.Rest); again != name {
			t.Fatalf("Parse(%q) = %+v, which Make makes into %q", name, p, again)
		}
	})
}
