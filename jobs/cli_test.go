package jobs

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gear-rl/gear/jobs/jobstest"
)

// These tests run the gearrun binary's job-spec commands that need no SLURM.

func TestGearrunValidate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds gearrun")
	}
	g := gearrunBinary(t)
	out, code := gearrunCmd(t, g, "validate", "examples/jobs/hello.toml", "examples/jobs/mpmd.toml")
	if code != 0 || !strings.Contains(out, `examples/jobs/mpmd.toml: ok: job "actor-trainer", 4 ranks: actor 3, trainer 1`) {
		t.Fatalf("validate of the examples: exit %d\n%s", code, out)
	}
	bad := jobstest.WriteSpec(t, "name = \"x\"\n[launch]\nnp = 2\ncommand = [\"./p\"]\n[[group]]\nrole = \"a\"\nnp = 0\ncommand = [\"./a\"]\n")
	out, code = gearrunCmd(t, g, "validate", bad)
	if code != 1 {
		t.Errorf("validate of an invalid spec: exit %d, want 1", code)
	}
	for _, want := range []string{"jobs: " + bad + ": group[0].np: must be at least 1", "jobs: " + bad + ": launch.command: must be empty with [[group]]"} {
		if !strings.Contains(out, want) {
			t.Errorf("validate output lacks %q:\n%s", want, out)
		}
	}
	unknown := jobstest.WriteSpec(t, "name = \"x\"\n[launch]\nnp = 2\ncomand = [\"./p\"]\n")
	out, code = gearrunCmd(t, g, "validate", unknown)
	if code != 1 || !strings.Contains(out, "jobs: "+unknown+":4:1: launch.comand: unknown key") {
		t.Errorf("validate of a misspelt key: exit %d\n%s", code, out)
	}
	// An empty string written for a key with a default is refused by validate
	// and run alike, with its place.
	empty := jobstest.WriteSpec(t, "name = \"\"\n[launch]\nnp = 1\ncommand = [\"true\"]\n")
	for _, cmd := range []string{"validate", "run"} {
		out, code = gearrunCmd(t, g, cmd, empty)
		if want := "jobs: " + empty + ":1:1: name: must not be empty"; code != 1 || !strings.Contains(out, want) {
			t.Errorf("%s of a spec with name = \"\": exit %d, want 1 and %q:\n%s", cmd, code, want, out)
		}
	}
	if _, code := gearrunCmd(t, g, "validate"); code != 2 {
		t.Errorf("validate without a file: exit %d, want 2", code)
	}
}

func TestGearrunRunLocal(t *testing.T) {
	if testing.Short() {
		t.Skip("builds gearrun")
	}
	g := gearrunBinary(t)
	spec := jobstest.WriteSpec(t, `
name = "local"
[launch]
grace = "1s"
[launch.env]
GREETING = "hi"
[[group]]
role = "actor"
np = 2
command = ["sh", "-c", "echo \"$GREETING $GEAR_ROLE $GEAR_ROLE_RANK of $GEAR_WORLD_SIZE spec $GEAR_JOB_SPEC\""]
[[group]]
role = "trainer"
np = 1
command = ["sh", "-c", "echo \"$GREETING $GEAR_ROLE $GEAR_ROLE_RANK of $GEAR_WORLD_SIZE\""]
`)
	out, code := gearrunCmd(t, g, "run", spec)
	if code != 0 {
		t.Fatalf("run: exit %d\n%s", code, out)
	}
	for _, want := range []string{"hi actor 0 of 3 spec " + spec, "hi actor 1 of 3", "hi trainer 0 of 3"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	out, code = gearrunCmd(t, g, "run", "--dry-run", spec)
	if code != 0 || !strings.Contains(out, "role actor: ranks 0-1") || !strings.Contains(out, "role trainer: ranks 2") {
		t.Errorf("run --dry-run: exit %d\n%s", code, out)
	}

	failing := jobstest.WriteSpec(t, `
name = "local-fail"
[launch]
np = 3
grace = "1s"
command = ["sh", "-c", "if [ \"$GEAR_RANK\" = 1 ]; then exit 5; fi; sleep 60"]
`)
	out, code = gearrunCmd(t, g, "run", failing)
	if code != 5 || !strings.Contains(out, "rank 1") {
		t.Errorf("run of a failing rank: exit %d, want 5, and a message naming rank 1:\n%s", code, out)
	}
}

func TestGearrunSubmitDryRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds gearrun")
	}
	g := gearrunBinary(t)
	state := t.TempDir()
	out, code := gearrunCmd(t, g, "submit", "--dry-run", "--state-dir", state, "examples/jobs/replay.toml")
	if code != 0 {
		t.Fatalf("submit --dry-run: exit %d\n%s", code, out)
	}
	for _, want := range []string{"#SBATCH --ntasks=16", "#SBATCH --gpus-per-node=4", "#SBATCH --output=" + filepath.Join(state, "jobs"), g + " run --slurm"} {
		if !strings.Contains(out, want) {
			t.Errorf("batch script lacks %q:\n%s", want, out)
		}
	}
	// A dry run records nothing.
	out, code = gearrunCmd(t, g, "status", "--state-dir", state)
	if code != 0 || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Errorf("status after a dry run: exit %d\n%s", code, out)
	}
	if out, code := gearrunCmd(t, g, "status", "--state-dir", state, "1234"); code != 1 || !strings.Contains(out, "no such job") {
		t.Errorf("status of an unknown job: exit %d\n%s", code, out)
	}
}
