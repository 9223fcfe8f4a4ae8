package jobs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gear-rl/gear/rank"
)

// fullSpec sets every field of every section to a value other than its default.
func fullSpec() *Spec {
	return &Spec{
		Name: "full",
		Launch: Launch{
			Env:           map[string]string{"A": "1", "B": "two words"},
			Timeout:       Duration(90 * time.Minute),
			Grace:         Duration(3 * time.Second),
			RdzvTimeout:   Duration(2 * time.Minute),
			OutputDir:     "out/full",
			Restarts:      3,
			CheckpointDir: "ckpt/full",
			TorchEnv:      new(false),
		},
		Groups: []Group{
			{Role: "actor", NP: 3, Command: []string{"./actor", "--env", "pong"}, Env: map[string]string{"B": "3"}},
			{Role: "trainer", NP: 2, Command: []string{"./trainer"}, GPUsPerRank: 1},
		},
		GMI: GMI{PerGPU: 2, Backend: BackendMPS},
		Slurm: Slurm{
			Partition: "gpu", Nodes: 2, NTasksPerNode: 3, CPUsPerTask: 4, GPUsPerNode: 2,
			Time: "1-00:00:00", Account: "lab", QOS: "high", Extra: []string{"--exclusive"},
			Gearrun: "/opt/gear/bin/gearrun", RdzvPort: 31000,
		},
		Table: &Table{
			Name: "replay",
			Columns: []Column{
				{Name: "obs", DType: "uint8", Shape: []int{84, 84, 4}},
				{Name: "reward", DType: "float32"},
			},
			Capacity:         1000,
			TrajectoryLength: 40,
			Sampler:          "prioritized",
			PriorityExponent: 0.6,
			Remover:          "min_heap",
			RateLimiter: RateLimiter{
				Kind: LimiterSampleToInsertRatio, MinSizeToSample: 100, SamplesPerInsert: 2.5, ErrorBuffer: 50,
			},
			MaxTimesSampled: 7,
		},
	}
}

func TestRoundTripFullSpec(t *testing.T) {
	want := fullSpec()
	if err := want.Validate(); err != nil {
		t.Fatalf("fullSpec does not validate: %v", err)
	}
	b, err := Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(b, "")
	if err != nil {
		t.Fatalf("Parse(Marshal(spec)): %v\n%s", err, b)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip changed the spec:\n got %+v\nwant %+v\nTOML:\n%s", got, want, b)
	}
}

// torch_env is on unless a spec says false, and a spec that says false
// launches without torchrun's variables.
func TestTorchEnvSwitch(t *testing.T) {
	for doc, on := range map[string]bool{
		"": true, "torch_env = true\n": true, "torch_env = false\n": false,
	} {
		s, err := Parse([]byte("name = \"t\"\n[launch]\ncommand = [\"./p\"]\n"+doc), "")
		if err != nil {
			t.Fatal(err)
		}
		if s.Launch.TorchEnvOn() != on {
			t.Errorf("%q: TorchEnvOn() = %v, want %v", doc, !on, on)
		}
		req, err := s.Request(t.Context(), "")
		if err != nil {
			t.Fatal(err)
		}
		if req.NoTorchEnv == on {
			t.Errorf("%q: launch request NoTorchEnv = %v", doc, req.NoTorchEnv)
		}
	}
	if _, err := Parse([]byte("name = \"t\"\n[launch]\ncommand = [\"./p\"]\ntorch_env = \"no\"\n"), "job.toml"); err == nil ||
		!strings.Contains(err.Error(), "torch_env") {
		t.Errorf("torch_env = \"no\": %v, want an error naming torch_env", err)
	}
}

// TestRoundTripSections round-trips each section on its own, on top of a
// minimal spec, so that a section that fails to encode is named.
func TestRoundTripSections(t *testing.T) {
	full := fullSpec()
	base := func() *Spec {
		return &Spec{Name: "s", Launch: Launch{NP: 5, Command: []string{"./p"}}}
	}
	sections := map[string]func(s *Spec){
		"name": func(s *Spec) { s.Name = "renamed.v2" },
		"launch": func(s *Spec) {
			s.Launch = full.Launch
			s.Launch.NP, s.Launch.Command, s.Launch.GPUsPerRank = 5, []string{"./p", "-x"}, 1
		},
		"group": func(s *Spec) { s.Launch = Launch{}; s.Groups = full.Groups },
		"gmi":   func(s *Spec) { s.GMI = full.GMI },
		"slurm": func(s *Spec) { s.Slurm = full.Slurm },
		"table": func(s *Spec) { tb := *full.Table; s.Table = &tb },
	}
	for name, set := range sections {
		t.Run(name, func(t *testing.T) {
			want := base()
			set(want)
			want.SetDefaults()
			if err := want.Validate(); err != nil {
				t.Fatalf("spec does not validate: %v", err)
			}
			b, err := Marshal(want)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Parse(b, "")
			if err != nil {
				t.Fatalf("Parse: %v\n%s", err, b)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("round trip changed the spec:\n got %+v\nwant %+v\nTOML:\n%s", got, want, b)
			}
		})
	}
}

func TestExamplesLoadAndRoundTrip(t *testing.T) {
	paths, err := filepath.Glob("../examples/jobs/*.toml")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			s, err := Load(p)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			again, err := Parse(b, "")
			if err != nil {
				t.Fatalf("Parse(Marshal): %v\n%s", err, b)
			}
			if !reflect.DeepEqual(again, s) {
				t.Fatalf("round trip changed the spec:\n got %+v\nwant %+v", again, s)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	s, err := Parse([]byte(`
[launch]
command = ["./hello"]
[table]
capacity = 10
trajectory_length = 5
[[table.columns]]
name = "x"
dtype = "float32"
`), "dir/my-job.toml")
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		field string
		got   any
		want  any
	}{
		{"name", s.Name, "my-job"},
		{"launch.np", s.Launch.NP, 1},
		{"launch.grace", s.Launch.Grace.D(), DefaultGrace},
		{"launch.timeout", s.Launch.Timeout.D(), time.Duration(0)},
		{"gmi.per_gpu", s.GMI.PerGPU, 1},
		{"gmi.backend", s.GMI.Backend, BackendNone},
		{"slurm.nodes", s.Slurm.Nodes, 1},
		{"slurm.ntasks_per_node", s.Slurm.NTasksPerNode, 0},
		{"slurm.cpus_per_task", s.Slurm.CPUsPerTask, 1},
		{"table.name", s.Table.Name, "replay"},
		{"table.sampler", s.Table.Sampler, "uniform"},
		{"table.remover", s.Table.Remover, "fifo"},
		{"table.rate_limiter.kind", s.Table.RateLimiter.Kind, LimiterMinSize},
		{"table.rate_limiter.min_size_to_sample", s.Table.RateLimiter.MinSizeToSample, 1},
		{"table.max_times_sampled", s.Table.MaxTimesSampled, 0},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.field, c.got, c.want)
		}
	}

	q := &Spec{Name: "q", Launch: Launch{NP: 8, Command: []string{"x"}}, GMI: GMI{PerGPU: 4},
		Slurm: Slurm{Nodes: 3}, Table: &Table{RateLimiter: RateLimiter{Kind: LimiterStack}}}
	q.SetDefaults()
	if q.Table.Sampler != "lifo" || q.Table.Remover != "lifo" || q.Table.MaxTimesSampled != 1 {
		t.Errorf("stack defaults: sampler %q remover %q max_times_sampled %d, want lifo lifo 1", q.Table.Sampler, q.Table.Remover, q.Table.MaxTimesSampled)
	}
	if q.GMI.Backend != BackendAuto {
		t.Errorf("gmi.backend with per_gpu 4 = %q, want auto", q.GMI.Backend)
	}
}

const validBase = `
name = "v"
[launch]
np = 2
command = ["./p"]
`

const validMPMD = `
name = "v"
[[group]]
role = "actor"
np = 2
command = ["./actor"]
[[group]]
role = "trainer"
np = 1
command = ["./trainer"]
`

const validTable = validBase + `
[table]
capacity = 10
trajectory_length = 4
[[table.columns]]
name = "obs"
dtype = "float32"
shape = [4]
`

// TestValidationRules gives each rule a spec that breaks it; the error must name
// the field and say what is wrong.
func TestValidationRules(t *testing.T) {
	tests := []struct {
		name, doc, field, problem string
	}{
		{"name chars", `name = "a b"` + "\n[launch]\ncommand=[\"x\"]\n", "name", "use letters"},
		{"launch.np", `name="v"` + "\n[launch]\nnp = -1\ncommand=[\"x\"]\n", "launch.np", "must be at least 1"},
		{"launch.np explicit zero", `name="v"` + "\n[launch]\nnp = 0\ncommand=[\"x\"]\n", "launch.np", "must be at least 1, got 0"},
		{"launch.np over the cap", `name="v"` + "\n[launch]\nnp = 2000000000\ncommand=[\"x\"]\n", "launch.np", "a job has at most 65536 ranks"},
		{"group.np over the cap", validMPMD + "[[group]]\nrole = \"big\"\nnp = 70000\ncommand = [\"x\"]\n", "group[2].np", "a job has at most 65536 ranks"},
		{"groups add up over the cap", validMPMD + "[[group]]\nrole = \"big\"\nnp = 65535\ncommand = [\"x\"]\n", "group", "add up to 65538"},
		{"groups overflow int", validMPMD + "[[group]]\nrole = \"big\"\nnp = 9223372036854775807\ncommand = [\"x\"]\n", "group", "more than any int holds"},
		{"launch.grace explicit zero", validBase + "grace = \"0s\"\n", "launch.grace", "must be positive, got 0s"},
		{"gmi.per_gpu explicit zero", validBase + "[gmi]\nper_gpu = 0\n", "gmi.per_gpu", "must be at least 1, got 0"},
		{"slurm.nodes explicit zero", validBase + "[slurm]\nnodes = 0\n", "slurm.nodes", "must be at least 1, got 0"},
		{"slurm.cpus_per_task explicit zero", validBase + "[slurm]\ncpus_per_task = 0\n", "slurm.cpus_per_task", "must be at least 1, got 0"},
		{"launch.command empty", `name="v"` + "\n[launch]\nnp = 2\n", "launch.command", "must name a program"},
		{"launch.command empty program", `name="v"` + "\n[launch]\ncommand = [\"\"]\n", "launch.command", "must name a program"},
		{"launch.command NUL", `name="v"` + "\n[launch]\ncommand = [\"x\", \"a\\u0000b\"]\n", "launch.command[1]", "NUL"},
		{"launch.gpus_per_rank", validBase + "gpus_per_rank = -1\n", "launch.gpus_per_rank", "must not be negative"},
		{"launch.timeout", validBase + "timeout = \"-5s\"\n", "launch.timeout", "must not be negative"},
		{"launch.grace", validBase + "grace = \"-1s\"\n", "launch.grace", "must not be negative"},
		{"launch.rdzv_timeout", validBase + "rdzv_timeout = \"-1s\"\n", "launch.rdzv_timeout", "must not be negative"},
		{"launch.output_dir", validBase + "output_dir = \"a\\nb\"\n", "launch.output_dir", "newline"},
		{"launch.restarts", validBase + "restarts = -1\n", "launch.restarts", "must not be negative, got -1"},
		{"launch.min_np above np", validBase + "restarts = 1\nmin_np = 3\n", "launch.min_np", "must be from 1 to launch.np (2), got 3"},
		{"launch.min_np negative", validBase + "restarts = 1\nmin_np = -1\n", "launch.min_np", "must be from 1 to launch.np (2), got -1"},
		{"launch.min_np without restarts", validBase + "min_np = 1\n", "launch.min_np", "needs launch.restarts"},
		{"launch.min_np with groups", validMPMD + "[launch]\nrestarts = 1\nmin_np = 1\n", "launch.min_np", "is for a job of one group"},
		{"launch.checkpoint_dir", validBase + "checkpoint_dir = \"a\\nb\"\n", "launch.checkpoint_dir", "newline"},
		{"launch.env name", validBase + "[launch.env]\n\"MY VAR\" = \"v\"\n", `launch.env."MY VAR"`, "not a valid environment variable name"},
		{"launch.env name digit", validBase + "[launch.env]\n1X = \"v\"\n", `launch.env.1X`, "not a valid environment variable name"},
		{"launch.env reserved", validBase + "[launch.env]\nGEAR_RANK = \"3\"\n", "launch.env.GEAR_RANK", "set by the launcher"},
		{"launch.env reserved token", validBase + "[launch.env]\nGEAR_JOB_TOKEN = \"x\"\n", "launch.env.GEAR_JOB_TOKEN", "set by the launcher"},
		{"launch.np with groups", validMPMD + "[launch]\nnp = 4\n", "launch.np", "sum to 3"},
		{"launch.command with groups", validMPMD + "[launch]\ncommand = [\"x\"]\n", "launch.command", "must be empty with [[group]]"},
		{"launch.gpus_per_rank with groups", validMPMD + "[launch]\ngpus_per_rank = 1\n", "launch.gpus_per_rank", "must be 0 with [[group]]"},
		{"group.np", validMPMD + "[[group]]\nrole = \"learner\"\nnp = 0\ncommand = [\"x\"]\n", "group[2].np", "must be at least 1"},
		{"group.role empty", validMPMD + "[[group]]\nnp = 1\ncommand = [\"x\"]\n", "group[2].role", "must not be empty"},
		{"group.role chars", validMPMD + "[[group]]\nrole = \"Big Role\"\nnp = 1\ncommand = [\"x\"]\n", "group[2].role", "lower-case"},
		{"group.role duplicate", validMPMD + "[[group]]\nrole = \"actor\"\nnp = 1\ncommand = [\"x\"]\n", "group[2].role", "also group[0]'s role"},
		{"group.command", validMPMD + "[[group]]\nrole = \"x\"\nnp = 1\n", "group[2].command", "must name a program"},
		{"group.gpus_per_rank", validMPMD + "[[group]]\nrole = \"x\"\nnp = 1\ncommand=[\"x\"]\ngpus_per_rank = -2\n", "group[2].gpus_per_rank", "must not be negative"},
		{"group.env reserved", validMPMD + "[group.env]\nGEAR_ROLE = \"x\"\n", "group[1].env.GEAR_ROLE", "set by the launcher"},
		{"gmi.per_gpu", validBase + "[gmi]\nper_gpu = -1\n", "gmi.per_gpu", "must be at least 1"},
		{"gmi.backend unknown", validBase + "[gmi]\nbackend = \"vgpu\"\n", "gmi.backend", `want "none", "mps", "mig" or "auto"`},
		{"gmi.backend none with per_gpu", validBase + "[gmi]\nper_gpu = 2\nbackend = \"none\"\n", "gmi.backend", "per_gpu is 2"},
		{"gmi with multi-GPU ranks", validBase + "gpus_per_rank = 2\n[gmi]\nper_gpu = 2\n", "launch.gpus_per_rank", "cannot span several"},
		{"slurm.nodes", validBase + "[slurm]\nnodes = -1\n", "slurm.nodes", "must be at least 1"},
		{"slurm.nodes more than ranks", validBase + "[slurm]\nnodes = 3\nntasks_per_node = 1\n", "slurm.nodes", "leaves nodes without a rank"},
		{"slurm.ntasks_per_node negative", validBase + "[slurm]\nntasks_per_node = -1\n", "slurm.ntasks_per_node", "must not be negative"},
		{"slurm.ntasks_per_node too few", validBase + "[slurm]\nntasks_per_node = 1\n", "slurm.ntasks_per_node", "fewer than the job's 2 ranks"},
		{"slurm.cpus_per_task", validBase + "[slurm]\ncpus_per_task = -4\n", "slurm.cpus_per_task", "must be at least 1"},
		{"slurm.gpus_per_node", validBase + "[slurm]\ngpus_per_node = -1\n", "slurm.gpus_per_node", "must not be negative"},
		{"slurm.time", validBase + "[slurm]\ntime = \"2h\"\n", "slurm.time", "want MM, MM:SS"},
		{"slurm.partition", validBase + "[slurm]\npartition = \"gpu; rm -rf\"\n", "slurm.partition", "must not contain spaces"},
		{"slurm.account", validBase + "[slurm]\naccount = \"a'b\"\n", "slurm.account", "must not contain spaces"},
		{"slurm.qos", validBase + "[slurm]\nqos = \"a b\"\n", "slurm.qos", "must not contain spaces"},
		{"slurm.extra not an option", validBase + "[slurm]\nextra = [\"exclusive\"]\n", "slurm.extra[0]", "want an sbatch option"},
		{"slurm.extra newline", validBase + "[slurm]\nextra = [\"--a\", \"--b\\nrm -rf /\"]\n", "slurm.extra[1]", "one line"},
		{"slurm.extra managed", validBase + "[slurm]\nextra = [\"--ntasks=8\"]\n", "slurm.extra[0]", "gearrun sets this option"},
		{"slurm.extra managed short", validBase + "[slurm]\nextra = [\"-N2\"]\n", "slurm.extra[0]", "gearrun sets this option"},
		{"slurm.extra export", validBase + "[slurm]\nextra = [\"--export=NONE\"]\n", "slurm.extra[0]", "gearrun sets this option"},
		{"slurm.gearrun", validBase + "[slurm]\ngearrun = \"a\\nb\"\n", "slurm.gearrun", "one line"},
		{"slurm.rdzv_port", validBase + "[slurm]\nrdzv_port = 70000\n", "slurm.rdzv_port", "port number"},
		{"table.name", strings.Replace(validTable, "[table]", "[table]\nname = \"bad name\"", 1), "table.name", "use letters"},
		{"table.columns empty", validBase + "[table]\ncapacity = 1\ntrajectory_length = 1\n", "table.columns", "at least one column"},
		{"table.columns.name", validTable + "[[table.columns]]\nname = \"9x\"\ndtype = \"int32\"\n", "table.columns[1].name", "use letters"},
		{"table.columns.name duplicate", validTable + "[[table.columns]]\nname = \"obs\"\ndtype = \"int32\"\n", "table.columns[1].name", "also columns[0]'s name"},
		{"table.columns.dtype", validTable + "[[table.columns]]\nname = \"a\"\ndtype = \"complex64\"\n", "table.columns[1].dtype", "want one of"},
		{"table.columns.shape", validTable + "[[table.columns]]\nname = \"a\"\ndtype = \"int32\"\nshape = [3, 0]\n", "table.columns[1].shape[1]", "must be at least 1"},
		{"table.capacity", strings.Replace(validTable, "capacity = 10", "capacity = -1", 1), "table.capacity", "must be at least 1"},
		{"table.trajectory_length", strings.Replace(validTable, "trajectory_length = 4", "trajectory_length = -3", 1), "table.trajectory_length", "must be at least 1"},
		{"table.sampler", strings.Replace(validTable, "[table]", "[table]\nsampler = \"random\"", 1), "table.sampler", "want one of"},
		{"table.remover", strings.Replace(validTable, "[table]", "[table]\nremover = \"oldest\"", 1), "table.remover", "want one of"},
		{"table.priority_exponent negative", strings.Replace(validTable, "[table]", "[table]\nsampler = \"prioritized\"\npriority_exponent = -1.0", 1), "table.priority_exponent", "must not be negative"},
		{"table.priority_exponent not prioritized", strings.Replace(validTable, "[table]", "[table]\npriority_exponent = 0.5", 1), "table.priority_exponent", "only applies"},
		{"table.max_times_sampled", strings.Replace(validTable, "[table]", "[table]\nmax_times_sampled = -1", 1), "table.max_times_sampled", "must not be negative"},
		{"table.rate_limiter.kind", validTable + "[table.rate_limiter]\nkind = \"leaky\"\n", "table.rate_limiter.kind", "want \"min_size\""},
		{"table.rate_limiter.min_size_to_sample", validTable + "[table.rate_limiter]\nmin_size_to_sample = -1\n", "table.rate_limiter.min_size_to_sample", "must be at least 1"},
		{"table.rate_limiter.min_size_to_sample too big", validTable + "[table.rate_limiter]\nmin_size_to_sample = 21\n", "table.rate_limiter.min_size_to_sample", "exceeds the table's capacity (2 shards × 10)"},
		{"table.rate_limiter.samples_per_insert", validTable + "[table.rate_limiter]\nkind = \"sample_to_insert_ratio\"\n", "table.rate_limiter.samples_per_insert", "must be positive"},
		{"table.rate_limiter.error_buffer", validTable + "[table.rate_limiter]\nkind = \"sample_to_insert_ratio\"\nsamples_per_insert = 1.0\nerror_buffer = -1.0\n", "table.rate_limiter.error_buffer", "must not be negative"},
		{"table.rate_limiter.samples_per_insert wrong kind", validTable + "[table.rate_limiter]\nsamples_per_insert = 1.0\n", "table.rate_limiter.samples_per_insert", "only applies to kind"},
		{"table.rate_limiter.error_buffer wrong kind", validTable + "[table.rate_limiter]\nkind = \"queue\"\nerror_buffer = 3.0\n", "table.rate_limiter.error_buffer", "only applies to kind"},
		{"queue sampler", strings.Replace(validTable, "[table]", "[table]\nsampler = \"uniform\"", 1) + "[table.rate_limiter]\nkind = \"queue\"\n", "table.sampler", `a queue takes "fifo"`},
		{"stack remover", strings.Replace(validTable, "[table]", "[table]\nremover = \"fifo\"", 1) + "[table.rate_limiter]\nkind = \"stack\"\n", "table.remover", `a stack takes "lifo"`},
		{"queue max_times_sampled", strings.Replace(validTable, "[table]", "[table]\nmax_times_sampled = 2", 1) + "[table.rate_limiter]\nkind = \"queue\"\n", "table.max_times_sampled", "a queue takes 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := "job.toml"
			if tt.field == "name" {
				file = "" // with a file, an empty name takes the file's
			}
			_, err := Parse([]byte(tt.doc), file)
			if err == nil {
				t.Fatalf("Parse accepted:\n%s", tt.doc)
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %q is not a *FieldError", err)
			}
			want := "jobs: job.toml: " + tt.field + ": "
			if file == "" {
				want = "jobs: " + tt.field + ": "
			}
			found := false
			for _, line := range strings.Split(err.Error(), "\n") {
				if strings.HasPrefix(line, want) && strings.Contains(line, tt.problem) {
					found = true
				}
			}
			if !found {
				t.Fatalf("error\n%s\nhas no line starting %q and containing %q", err, want, tt.problem)
			}
		})
	}
}

func TestValidSpecsPass(t *testing.T) {
	for name, doc := range map[string]string{"spmd": validBase, "mpmd": validMPMD, "table": validTable} {
		if _, err := Parse([]byte(doc), ""); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name, doc string
		want      []string
	}{
		{"unknown keys with positions", "name = \"x\"\n[launch]\nnpp = 3\ncommand = [\"a\"]\n[[group]]\nrole = \"a\"\n[[group]]\nrole = \"b\"\n  foo = 1\n[slurm]\npartiton = \"gpu\"\n",
			[]string{"jobs: job.toml:3:1: launch.npp: unknown key", "jobs: job.toml:9:3: group[1].foo: unknown key", "jobs: job.toml:11:1: slurm.partiton: unknown key"}},
		{"unknown section", "[lanch]\nnp = 1\n", []string{"jobs: job.toml:1:2: lanch: unknown key"}},
		{"unknown table key", "[table]\ncolumns = [{name = \"a\", dtype = \"int8\", shap = [1]}]\n", []string{"jobs: job.toml:2:41: ", "shap: unknown key"}},
		{"array table index", "[table]\n[[table.columns]]\nname = \"a\"\n[[table.columns]]\nnmae = \"b\"\n", []string{"jobs: job.toml:5:1: table.columns[1].nmae: unknown key"}},
		{"wrong type", "[launch]\nnp = \"four\"\n", []string{"jobs: job.toml:2:", "launch.np: want int, got TOML string"}},
		{"wrong type in group", "[[group]]\nrole = 3\n", []string{"jobs: job.toml:2:", "group[0].role: want string, got TOML integer"}},
		{"wrong type in a later group", "[[group]]\nrole = \"a\"\nnp = 1\n[[group]]\nrole = \"b\"\nnp = \"2\"\n", []string{"jobs: job.toml:6:6: group[1].np: want int, got TOML string"}},
		{"wrong type in a nested array table", "[[group]]\nrole = \"a\"\n[[table.columns]]\nname = \"a\"\n[[table.columns]]\nname = \"b\"\ndtype = 8\n", []string{"jobs: job.toml:7:9: table.columns[1].dtype: want string, got TOML integer"}},
		{"bad duration", "[launch]\ntimeout = \"soon\"\n", []string{"jobs: job.toml:2:", "launch.timeout: want a duration such as"}},
		{"integer duration", "[launch]\ngrace = 30\n", []string{"jobs: job.toml:2:1: launch.grace: want a duration string such as \"90s\", got 30"}},
		{"syntax", "name = \n", []string{"jobs: job.toml:1:"}},
		{"duplicate key", "name = \"a\"\nname = \"b\"\n", []string{"jobs: job.toml:2:1:", "already defined"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc), "job.toml")
			if err == nil {
				t.Fatal("Parse accepted the document")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n%s\ndoes not contain %q", err, w)
				}
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, "jobs: ") {
					t.Errorf("error line %q does not start with \"jobs: \"", line)
				}
			}
		})
	}
}

// TestDecodeErrorsAllAtOnce: a spec with several mistakes of different kinds
// reports every one of them in one run, in the order of the document, each as
// file:line:column: key.
// TestEmptyStringsRefused: a string key whose empty value means nothing,
// written as "", is an error with its place, not a missing key that takes its
// default; left out, it still takes it.
func TestEmptyStringsRefused(t *testing.T) {
	const groups = "[[group]]\nrole = \"a\"\nnp = 1\ncommand = [\"x\"]\n[[group]]\n"
	const table = "name = \"v\"\n[launch]\ncommand = [\"x\"]\n[table]\ncapacity = 1\ntrajectory_length = 1\n"
	const column = "[[table.columns]]\nname = \"obs\"\ndtype = \"int8\"\n"
	for _, c := range []struct{ doc, want string }{
		{"name = \"\"\n[launch]\ncommand = [\"x\"]\n", "jobs: job.toml:1:1: name: must not be empty; leave the key out for its default"},
		{"name = \"v\"\n[launch]\ncommand = [\"x\"]\n[gmi]\nbackend = \"\"\n", "jobs: job.toml:5:1: gmi.backend: must not be empty; leave the key out for its default"},
		{table + "name = \"\"\n" + column, "jobs: job.toml:7:1: table.name: must not be empty; leave the key out for its default"},
		{table + "sampler = \"\"\n" + column, "jobs: job.toml:7:1: table.sampler: must not be empty; leave the key out for its default"},
		{table + "remover = \"\"\n" + column, "jobs: job.toml:7:1: table.remover: must not be empty; leave the key out for its default"},
		{table + column + "[table.rate_limiter]\nkind = \"\"\n", "jobs: job.toml:11:1: table.rate_limiter.kind: must not be empty; leave the key out for its default"},
		{table + "rate_limiter = {kind = \"\"}\n" + column, "jobs: job.toml:7:1: table.rate_limiter.kind: must not be empty; leave the key out for its default"},
		{"name = \"v\"\n" + groups + "role = \"\"\nnp = 1\ncommand = [\"y\"]\n", "jobs: job.toml:7:1: group[1].role: must not be empty"},
		{table + column + "[[table.columns]]\nname = \"\"\ndtype = \"int8\"\n", "jobs: job.toml:11:1: table.columns[1].name: must not be empty"},
	} {
		for _, parse := range []func([]byte, string) (*Spec, error){Parse, DecodeDefaults} {
			_, err := parse([]byte(c.doc), "job.toml")
			if err == nil || err.Error() != c.want {
				t.Errorf("error %v, want %q; document:\n%s", err, c.want, c.doc)
				continue
			}
			if fe := (*FieldError)(nil); !errors.As(err, &fe) {
				t.Errorf("error %q is not a *FieldError", err)
			}
		}
	}
	// Left out, each takes its default.
	s, err := Parse([]byte(table+column), "job.toml")
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "v" || s.GMI.Backend != BackendNone || s.Table.Name != DefaultTableName || s.Table.Sampler == "" || s.Table.Remover == "" || s.Table.RateLimiter.Kind != LimiterMinSize {
		t.Errorf("defaults not filled: %+v, %+v", s.GMI, s.Table)
	}
	if s, err := Parse([]byte("[launch]\ncommand = [\"x\"]\n"), "dir/job.toml"); err != nil || s.Name != "job" {
		t.Errorf("a spec without a name: %v, name %q; want the file's, job", err, s.Name)
	}
}

func TestDecodeErrorsAllAtOnce(t *testing.T) {
	doc := `name = "x"
[launch]
np = "four"
comand = ["a"]
timeout = 30
grace = "soon"
restarts = "two"
[[group]]
role = "a"
np = 1
[[group]]
role = 7
np = 1
[slurm]
nodes = "many"
partiton = "gpu"
[table]
checkpoint_every = 5
capacity = [
  1,
]
`
	_, err := Parse([]byte(doc), "job.toml")
	if err == nil {
		t.Fatal("Parse accepted the document")
	}
	want := []string{
		"jobs: job.toml:3:6: launch.np: want int, got TOML string",
		"jobs: job.toml:5:1: launch.timeout: want a duration string such as \"90s\", got 30",
		"jobs: job.toml:6:9: launch.grace: want a duration such as",
		"jobs: job.toml:7:12: launch.restarts: want int, got TOML string",
		"jobs: job.toml:12:8: group[1].role: want string, got TOML integer",
		"jobs: job.toml:15:9: slurm.nodes: want int, got TOML string",
		"jobs: job.toml:18:1: table.checkpoint_every: want a duration string such as \"90s\", got 5",
		"jobs: job.toml:19:",
	}
	lines := strings.Split(err.Error(), "\n")
	for _, w := range want {
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, w) }) {
			t.Errorf("no error line starts with %q; got\n%s", w, err)
		}
	}
	// The unknown keys are found once the values of the wrong type are out of
	// the way.
	for _, w := range []string{"jobs: job.toml:4:1: launch.comand: unknown key", "jobs: job.toml:16:1: slurm.partiton: unknown key"} {
		if !slices.Contains(lines, w) {
			t.Errorf("no error line %q; got\n%s", w, err)
		}
	}
	if len(lines) != len(want)+2 {
		t.Errorf("got %d error lines, want %d:\n%s", len(lines), len(want)+2, err)
	}
	// Each line names its place before its key, in the order of the document.
	prev := 0
	for _, l := range lines {
		var line int
		if _, err := fmt.Sscanf(strings.TrimPrefix(l, "jobs: job.toml:"), "%d:", &line); err != nil {
			t.Errorf("error line %q does not start with jobs: job.toml:LINE:", l)
			continue
		}
		if line < prev {
			t.Errorf("error line %q comes after one for line %d", l, prev)
		}
		prev = line
	}
}

// Without a file name, a decode error still starts with "jobs: " and names its
// place by line and column.
func TestDecodeErrorsWithoutFile(t *testing.T) {
	_, err := Parse([]byte("[launch]\nnp = \"two\"\ngrace = 30\n"), "")
	if err == nil {
		t.Fatal("Parse accepted the document")
	}
	want := []string{
		"jobs: line 2, column 6: launch.np: want int, got TOML string",
		"jobs: line 3, column 1: launch.grace: want a duration string such as \"90s\", got 30",
	}
	if got := strings.Split(err.Error(), "\n"); !slices.Equal(got, want) {
		t.Errorf("error\n%s\nwant\n%s", err, strings.Join(want, "\n"))
	}
}

func TestRoles(t *testing.T) {
	s := fullSpec()
	roles := s.Roles()
	if len(roles) != 2 || s.WorldSize() != 5 {
		t.Fatalf("roles %+v, world %d", roles, s.WorldSize())
	}
	if roles[1].FirstRank != 3 || roles[1].Name != "trainer" {
		t.Errorf("trainer role = %+v", roles[1])
	}
	if roles[0].Env["A"] != "1" || roles[0].Env["B"] != "3" || roles[1].Env["B"] != "two words" {
		t.Errorf("env not overlaid: actor %v trainer %v", roles[0].Env, roles[1].Env)
	}
	for r, want := range []struct {
		role     string
		roleRank int
	}{{"actor", 0}, {"actor", 1}, {"actor", 2}, {"trainer", 0}, {"trainer", 1}} {
		ro, rr, ok := s.RoleOf(r)
		if !ok || ro.Name != want.role || rr != want.roleRank {
			t.Errorf("RoleOf(%d) = %q %d %v, want %q %d", r, ro.Name, rr, ok, want.role, want.roleRank)
		}
	}
	if _, _, ok := s.RoleOf(5); ok {
		t.Error("RoleOf(5) found a role in a world of 5")
	}
	roles[0].Env["A"] = "changed"
	if s.Launch.Env["A"] != "1" {
		t.Error("Roles shares its env maps with the spec")
	}
}

func TestFromEnv(t *testing.T) {
	t.Setenv(rank.EnvJobSpec, "")
	if _, err := FromEnv(); !errors.Is(err, ErrNoSpec) {
		t.Fatalf("FromEnv without %s: %v, want ErrNoSpec", rank.EnvJobSpec, err)
	}
	path := filepath.Join(t.TempDir(), "job.toml")
	if err := os.WriteFile(path, []byte(validTable), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(rank.EnvJobSpec, path)
	s, err := FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if s.Table == nil || s.Table.Columns[0].Name != "obs" || s.Table.Capacity != 10 {
		t.Fatalf("FromEnv table = %+v", s.Table)
	}
	t.Setenv(rank.EnvJobSpec, filepath.Join(t.TempDir(), "missing.toml"))
	if _, err := FromEnv(); err == nil || !strings.HasPrefix(err.Error(), "jobs: ") {
		t.Fatalf("FromEnv with a missing file: %v", err)
	}
}

// FuzzParse feeds the loader arbitrary documents: it must not panic, every error
// must start with "jobs: ", and whatever it accepts must validate and survive a
// round trip through Marshal unchanged.
func FuzzParse(f *testing.F) {
	for _, doc := range []string{validBase, validMPMD, validTable, "", "name = 1", "[launch]\nnp = 1e3\n",
		"[[group]]\n[[group]]\n", "[table.rate_limiter]\nkind = \"queue\"\n", "[launch.env]\nA = \"\\u0000\"\n"} {
		f.Add([]byte(doc))
	}
	if paths, _ := filepath.Glob("../examples/jobs/*.toml"); len(paths) > 0 {
		for _, p := range paths {
			if b, err := os.ReadFile(p); err == nil {
				f.Add(b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(data, "fuzz.toml")
		if err != nil {
			for _, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, "jobs: ") {
					t.Fatalf("error line %q does not start with \"jobs: \"", line)
				}
			}
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("Parse accepted a spec that does not validate: %v", err)
		}
		b, err := Marshal(s)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		again, err := Parse(b, "fuzz.toml")
		if err != nil {
			t.Fatalf("Parse(Marshal(spec)): %v\n%s", err, b)
		}
		if !reflect.DeepEqual(again, s) {
			t.Fatalf("round trip changed the spec:\n got %+v\nwant %+v\n%s", again, s, b)
		}
	})
}
