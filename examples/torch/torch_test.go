// Package torch_test runs the PyTorch examples under gearrun: with -np 3, from
// a job spec, and through gearrun submit on SLURM. They need a Python whose
// torch has torch.distributed with gloo (Debian's python3-torch): the first of
// $GEAR_PYTHON, python3 on PATH and /usr/bin/python3 that imports it. Without
// one the tests skip, unless GEAR_REQUIRE_TORCH=1 (set by .ci/run), which
// makes that a failure.
package torch_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/geartest"
	"github.com/gear-rl/gear/internal/statehome"
	"github.com/gear-rl/gear/jobs/jobstest"
)

var bins = geartest.NewCommands("github.com/gear-rl/gear/cmd/gearrun")

func TestMain(m *testing.M) {
	removeState := statehome.Private()
	code := m.Run()
	removeState()
	bins.Remove()
	os.Exit(code)
}

// root is the module root, where the examples' paths start.
const root = "../.."

var (
	pythonOnce sync.Once
	pythonPath string
	pythonWhy  string
)

// python returns an interpreter that imports torch.distributed with gloo, or
// skips (fails under GEAR_REQUIRE_TORCH=1).
func python(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("PyTorch tests skipped in -short mode")
	}
	pythonOnce.Do(func() {
		var tried []string
		for _, cand := range []string{os.Getenv("GEAR_PYTHON"), "python3", "/usr/bin/python3"} {
			if cand == "" {
				continue
			}
			path, err := exec.LookPath(cand)
			if err != nil {
				tried = append(tried, cand+": not found")
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			out, err := exec.CommandContext(ctx, path, "-c",
				"import torch.distributed as d; assert d.is_available() and d.is_gloo_available(), 'no gloo'").CombinedOutput()
			cancel()
			if err == nil {
				pythonPath = path
				return
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			tried = append(tried, fmt.Sprintf("%s: %s", path, lines[len(lines)-1]))
		}
		pythonWhy = "no Python with torch.distributed and gloo (" + strings.Join(tried, "; ") + "); install Debian's python3-torch or set GEAR_PYTHON"
	})
	if pythonPath == "" {
		if os.Getenv("GEAR_REQUIRE_TORCH") == "1" {
			t.Fatalf("GEAR_REQUIRE_TORCH=1 but %s", pythonWhy)
		}
		t.Skipf("skipping PyTorch test: %s (set GEAR_REQUIRE_TORCH=1 to make this a failure)", pythonWhy)
	}
	return pythonPath
}

// gearrun runs the gearrun binary in the module root.
func gearrun(t *testing.T, args ...string) (string, int) {
	t.Helper()
	return jobstest.Gearrun(t, root, bins.Path(t, "gearrun"), args...)
}

// checkAllReduce checks that every one of np ranks printed the right sum of
// allreduce.py (arange(8) + rank, summed over the ranks).
func checkAllReduce(t *testing.T, out string, np int) {
	t.Helper()
	sum := make([]string, 8)
	for i := range sum {
		sum[i] = strconv.Itoa(np*i+np*(np-1)/2) + ".0"
	}
	for r := range np {
		want := fmt.Sprintf("allreduce: rank %d of %d: sum [%s]: ok", r, np, strings.Join(sum, ", "))
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

var ddpLine = regexp.MustCompile(`ddp: rank (\d+) of (\d+): (\d+) steps, loss ([0-9.]+) -> ([0-9.]+), (\d+) parameters, digest ([0-9a-f]{16}): (\w+)`)

// checkDDP checks that every one of np ranks of ddp.py trained, and that all
// printed the same digest of their parameters (each started from a model of
// its own seed, so only DDP makes them agree).
func checkDDP(t *testing.T, out string, np int) {
	t.Helper()
	digests := map[int]string{}
	for _, m := range ddpLine.FindAllStringSubmatch(out, -1) {
		r, _ := strconv.Atoi(m[1])
		if m[2] != strconv.Itoa(np) {
			t.Errorf("rank %d reports a world of %s, want %d", r, m[2], np)
		}
		first, _ := strconv.ParseFloat(m[4], 64)
		last, _ := strconv.ParseFloat(m[5], 64)
		if !(last < first) {
			t.Errorf("rank %d: loss %s -> %s did not fall", r, m[4], m[5])
		}
		if m[8] != "agree" {
			t.Errorf("rank %d says its parameters %s", r, m[8])
		}
		digests[r] = m[7]
	}
	if len(digests) != np {
		t.Fatalf("%d of %d ranks reported their parameters:\n%s", len(digests), np, out)
	}
	for r, d := range digests {
		if d != digests[0] {
			t.Errorf("rank %d ends with parameters %s, rank 0 with %s:\n%s", r, d, digests[0], out)
		}
	}
}

// The README's commands, as written: the ranks start through
// examples/torch/python, which finds the interpreter as python does (here
// told by GEAR_PYTHON, which the ranks inherit).
func TestTorchUnderGearrun(t *testing.T) {
	t.Setenv("GEAR_PYTHON", python(t))
	out, code := gearrun(t, "-np", "3", "examples/torch/python", "examples/torch/allreduce.py")
	if code != 0 {
		t.Fatalf("gearrun -np 3 examples/torch/python allreduce.py: exit %d\n%s", code, out)
	}
	checkAllReduce(t, out, 3)
	out, code = gearrun(t, "-np", "3", "examples/torch/python", "examples/torch/ddp.py")
	if code != 0 {
		t.Fatalf("gearrun -np 3 examples/torch/python ddp.py: exit %d\n%s", code, out)
	}
	checkDDP(t, out, 3)
}

// examples/torch/python takes $GEAR_PYTHON, then python3 on PATH, then
// /usr/bin/python3, the first that has torch; with none it names what it tried
// and what to set, and exits 127. Fake interpreters stand in for real ones, so
// this runs without torch.
func TestTorchPythonFinder(t *testing.T) {
	dir := t.TempDir()
	// fake writes an interpreter that has torch (the probe exits 0) or not,
	// and otherwise prints its name and arguments.
	fake := func(name string, torch bool) string {
		probe := "exit 1"
		if torch {
			probe = "exit 0"
		}
		path := filepath.Join(dir, name)
		script := "#!/bin/sh\nif [ \"$1\" = -c ]; then " + probe + "; fi\necho " + name + " \"$@\"\n"
		if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		return path
	}
	withTorch, without := fake("gear-python", true), fake("no-torch", false)
	bin := filepath.Join(dir, "bin")
	os.Mkdir(bin, 0o755)
	finder, err := filepath.Abs(filepath.Join(root, "examples/torch/python"))
	if err != nil {
		t.Fatal(err)
	}
	runFinder := func(script string, env ...string) (string, string, int) {
		cmd := exec.Command("/bin/sh", script, "train.py", "--steps", "2")
		cmd.Env = append([]string{"PATH=" + bin}, env...)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), code
	}
	if out, errs, code := runFinder(finder, "GEAR_PYTHON="+withTorch); code != 0 || out != "gear-python train.py --steps 2\n" {
		t.Errorf("GEAR_PYTHON with torch: exit %d, %q %q; want it run", code, out, errs)
	}
	// GEAR_PYTHON without torch: python3 on PATH is next.
	os.Symlink(withTorch, filepath.Join(bin, "python3"))
	if out, errs, code := runFinder(finder, "GEAR_PYTHON="+without); code != 0 || out != "gear-python train.py --steps 2\n" {
		t.Errorf("GEAR_PYTHON without torch, python3 with: exit %d, %q %q; want python3 run", code, out, errs)
	}
	// None has torch: the same script with a /usr/bin/python3 that is not
	// there, as on a machine without one.
	os.Remove(filepath.Join(bin, "python3"))
	os.Symlink(without, filepath.Join(bin, "python3"))
	b, err := os.ReadFile(finder)
	if err != nil {
		t.Fatal(err)
	}
	noSystem := filepath.Join(dir, "python-finder")
	os.WriteFile(noSystem, []byte(strings.ReplaceAll(string(b), "/usr/bin/python3", filepath.Join(dir, "absent", "python3"))), 0o755)
	out, errs, code := runFinder(noSystem, "GEAR_PYTHON="+without)
	if code != 127 || out != "" || !strings.Contains(errs, "no Python with torch") || !strings.Contains(errs, "set GEAR_PYTHON") ||
		!strings.Contains(errs, without+" (no torch)") || !strings.Contains(errs, "python3 (no torch)") || !strings.Contains(errs, "absent/python3 (not found)") {
		t.Errorf("no Python with torch: exit %d, %q %q; want 127 and what was tried and what to set", code, out, errs)
	}
}

// Without torchrun's variables, torch's env:// init has nothing to read: the
// contract is what makes the examples work.
func TestTorchEnvOff(t *testing.T) {
	py := python(t)
	out, code := gearrun(t, "--torch-env=false", "--grace", "2s", "-np", "2", py, "examples/torch/allreduce.py")
	if code == 0 || !strings.Contains(out, "env://") {
		t.Fatalf("--torch-env=false: exit %d, want a failure of torch's env:// init:\n%s", code, out)
	}
}

// torchSpecs returns job specs for both examples with the interpreter that
// imports torch: examples/jobs/torch-ddp.toml as shipped, and one for
// allreduce.py.
func torchSpecs(t *testing.T, py string) (ddp, allreduce string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "examples/jobs/torch-ddp.toml"))
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Replace(string(b), `command = ["examples/torch/python", `, fmt.Sprintf(`command = [%q, `, py), 1)
	if doc == string(b) {
		t.Fatal("examples/jobs/torch-ddp.toml: no examples/torch/python command to replace")
	}
	ddp = jobstest.WriteSpec(t, doc)
	allreduce = jobstest.WriteSpec(t, fmt.Sprintf(`name = "torch-allreduce"
[launch]
np = 3
command = [%q, "examples/torch/allreduce.py"]
timeout = "5m"
grace = "5s"
[slurm]
extra = ["--overcommit"]
`, py))
	return ddp, allreduce
}

func TestTorchFromJobSpec(t *testing.T) {
	py := python(t)
	// examples/jobs/torch-ddp.toml as shipped, as the README runs it.
	t.Setenv("GEAR_PYTHON", py)
	out, code := gearrun(t, "run", "examples/jobs/torch-ddp.toml")
	if code != 0 {
		t.Fatalf("gearrun run examples/jobs/torch-ddp.toml: exit %d\n%s", code, out)
	}
	checkDDP(t, out, 3)
	_, allreduce := torchSpecs(t, py)
	out, code = gearrun(t, "run", allreduce)
	if code != 0 {
		t.Fatalf("gearrun run (allreduce): exit %d\n%s", code, out)
	}
	checkAllReduce(t, out, 3)
}

func TestTorchSlurm(t *testing.T) {
	jobstest.RequireSlurm(t)
	ddp, allreduce := torchSpecs(t, python(t))
	gearrunBin := bins.Path(t, "gearrun")
	a := jobstest.Submit(t, root, gearrunBin, allreduce)
	d := jobstest.Submit(t, root, gearrunBin, ddp)
	state, log := a.Wait()
	if state != "COMPLETED" {
		t.Fatalf("allreduce: state %s, want COMPLETED; log:\n%s", state, log)
	}
	checkAllReduce(t, log, 3)
	state, log = d.Wait()
	if state != "COMPLETED" {
		t.Fatalf("ddp: state %s, want COMPLETED; log:\n%s", state, log)
	}
	checkDDP(t, log, 3)
}
