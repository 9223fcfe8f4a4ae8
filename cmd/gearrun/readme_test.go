package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// How each command in the README's shell blocks is covered. A command that
// holds a placeholder ("./your-program", "your-job-id", "your-host1") needs no
// entry; every other command needs one, so that a command added to the README
// is either run by a test or visibly a placeholder:
//
//   - here: TestReadmeCommands runs it, as written, with this test binary as
//     bin/gearrun, in the module root (with a state and runtime directory of its
//     own), and wants exit 0.
//   - test FILE TestName: that test runs it, or the same thing with the test's
//     own paths (the entry says which); FILE must hold func TestName.
//   - needs WHAT: it works as written where WHAT is at hand, which no test
//     here can provide (root, the network, a GPU, a cluster).
var readmeCommands = map[string]string{
	"go run ./cmd/gearrun run examples/jobs/dqn.toml": "test examples/dqn/gearrun_test.go TestDistributedQuickRun: the job's programs and roles, with --quick; TestJobSpec checks the spec itself (the full run trains for a minute)",
	"make test":                                                           "needs: it is the test suite itself",
	"go build -o bin/gearrun ./cmd/gearrun":                               "test examples/external_test.go TestExternalModule: gearrun built with go build -o into a directory of the test's own (geartest.Commands), not bin/ of the checkout",
	"bin/gearrun -h":                                                      "here",
	"bin/gearrun -np 4 ./examples/hello":                                  "here",
	"bin/gearrun -np 4 --output-dir logs ./examples/hello":                "here",
	"bin/gearrun status":                                                  "here",
	"bin/gearrun clean":                                                   "test cmd/gearrun/local_test.go TestCleanCheckpointsPrefixesAndListing: with --shm-dir and --runtime-dir of the test's own (a clean of /dev/shm would judge other users' tests' jobs gone)",
	"go mod init example.com/trainer":                                     "test examples/external_test.go TestReadmeModuleProgram: a module made the way the README says, with a replace of this checkout",
	"go get github.com/gear-rl/gear@latest":                               "needs: the network (the test points the module at this checkout instead)",
	"go install github.com/gear-rl/gear/cmd/gearrun@latest":               "needs: the network",
	"go build -o trainer . && gearrun -np 4 ./trainer":                    "test examples/external_test.go TestReadmeModuleProgram: builds the README's program and runs it under gearrun",
	"bin/gearrun -np 3 examples/torch/python examples/torch/allreduce.py": "test examples/torch/torch_test.go TestTorchUnderGearrun",
	"bin/gearrun -np 3 examples/torch/python examples/torch/ddp.py":       "test examples/torch/torch_test.go TestTorchUnderGearrun",
	"bin/gearrun -np 1 --bind gpu examples/torch/python examples/torch/allreduce.py --backend nccl": "needs: a GPU with NCCL and torch",
	"bin/gearrun run examples/jobs/torch-ddp.toml":                                                  "test examples/torch/torch_test.go TestTorchFromJobSpec",
	"bin/gearrun validate examples/jobs/hello.toml":                                                 "here",
	"bin/gearrun run examples/jobs/hello.toml":                                                      "here",
	"bin/gearrun submit --dry-run examples/jobs/hello.toml":                                         "here",
	"bin/gearrun submit examples/jobs/hello.toml":                                                   "test jobs/slurm_e2e_test.go TestSlurmHelloAllReduce: needs a SLURM cluster (skips without one)",
	"sudo apt-get install -y slurm-wlm munge":                                                       "needs: root and Debian's mirror",
	`scripts/slurm-local.sh up && eval "$(scripts/slurm-local.sh env)"`:                             "needs: slurm-wlm and munge installed (bash .ci/run does it, then runs make test with the cluster required)",
	"bin/gearrun submit examples/jobs/dqn.toml":                                                     "needs: a SLURM cluster",
	"scripts/slurm-local.sh down":                                                                   "needs: a cluster that scripts/slurm-local.sh up started",
	"bin/gearrun --max-restarts 2 -np 1 ./examples/dqn --role trainer --checkpoint-every 10s : -np 2 ./examples/dqn --role actor": "test examples/dqn/restart_test.go TestGearrunMaxRestarts: the same roles under --max-restarts, with the trainer killed (the README's command trains for a minute and needs no restart)",
	"bin/gearrun run examples/jobs/dqn-elastic.toml": "test examples/dqn/restart_test.go TestGearrunMaxRestarts: the spec's roles and restarts, with the trainer killed",
	"bin/gearrun gpus": "here",
	"bin/gearrun gmi plan -np 6 --gmi-per-gpu 3 --topology examples/topologies/a100-2x.toml": "here",
	"go build -o bin/gearbench ./cmd/gearbench":                                              "needs: nothing, but it writes bin/ of the checkout; the gearbench tests build it into a directory of their own",
	"bin/gearrun -np 2 bin/gearbench allreduce --sizes 8,1K,64K,1M,16M,64M":                  "test cmd/gearbench/bench_collective_test.go TestBenchCollectivesThreeRanks: gearbench's collectives in three rank processes as gearrun starts them (launchtest.RunRanks), with small sizes",
	"make python": "needs: gcc for cgo; make test runs it before the Python tests (python-test depends on it)",
	"go run ./cmd/gearrun run examples/jobs/dqn-torch.toml": "needs: minutes of training; python/tests/test_dqn.py runs the same spec with GEAR_DQN=1 or GEAR_REQUIRE_PYTHON=1 (CI)",
	"bin/gearbench store":        "needs: minutes of an otherwise idle machine (2m22s on 2 busy cores) and a few hundred MB of /dev/shm and disk: a benchmark (docs/benchmarks.md) that no test runs",
	"bench/peers/allreduce.sh":   "needs: Open MPI (the script installs it with apt-get: root and Debian's mirror)",
	"bench/peers/launch_time.sh": "needs: Open MPI (the script installs it with apt-get: root and Debian's mirror)",
}

// placeholder matches the words the docs use for what the reader supplies.
var placeholder = regexp.MustCompile(`\byour-[a-z0-9-]+`)

// shellComment is a comment after a command.
var shellComment = regexp.MustCompile(`\s+#.*$`)

// readmeShellCommands returns the commands of the ```sh blocks of a Markdown
// document, without their comments.
func readmeShellCommands(doc string) []string {
	var cmds []string
	in := false
	for _, line := range strings.Split(doc, "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			in = true
			continue
		case strings.HasPrefix(line, "```"):
			in = false
			continue
		}
		if !in {
			continue
		}
		line = shellComment.ReplaceAllString(line, "")
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			cmds = append(cmds, line)
		}
	}
	return cmds
}

// Every command in the README's shell blocks is run by a test (this one, or
// the one its entry names) or is visibly a placeholder.
func TestReadmeCommands(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	cmds := readmeShellCommands(string(b))
	if len(cmds) < 20 {
		t.Fatalf("found %d commands in README.md's shell blocks; the parser is broken", len(cmds))
	}
	seen := map[string]bool{}
	var here []string
	for _, c := range cmds {
		seen[c] = true
		how, ok := readmeCommands[c]
		switch {
		case placeholder.MatchString(c):
			if ok {
				t.Errorf("README command %q holds a placeholder and needs no entry", c)
			}
		case !ok:
			t.Errorf("README command %q is neither run by a test nor a placeholder (./your-program): give it an entry in readmeCommands", c)
		case how == "here":
			here = append(here, c)
		case strings.HasPrefix(how, "test "):
			f := strings.Fields(how)
			src, err := os.ReadFile(filepath.Join(root, f[1]))
			name := strings.TrimSuffix(f[2], ":")
			if err != nil || !bytes.Contains(src, []byte("\nfunc "+name+"(t *testing.T)")) {
				t.Errorf("README command %q: %s has no %s (%v)", c, f[1], name, err)
			}
		case strings.HasPrefix(how, "needs: "):
		default:
			t.Errorf("README command %q: entry %q is not here, test FILE TestName or needs: WHAT", c, how)
		}
	}
	for c := range readmeCommands {
		if !seen[c] {
			t.Errorf("readmeCommands has %q, which README.md no longer shows", c)
		}
	}

	privateState(t)
	t.Chdir(root)
	if _, err := os.Stat("logs"); err == nil {
		t.Fatal("the checkout already has logs/, which --output-dir logs would write into")
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Join(root, "logs")) })
	for _, c := range here {
		args := strings.Fields(c)
		if args[0] != "bin/gearrun" {
			t.Errorf("README command %q: only bin/gearrun commands can run here", c)
			continue
		}
		code, out, errs := gearrunIn(args[1:]...)
		if code != 0 {
			t.Errorf("README command %q: exit %d\nstdout:\n%s\nstderr:\n%s", c, code, out, errs)
		}
		if strings.Contains(c, "--output-dir logs") {
			if _, err := os.Stat(filepath.Join("logs", "rank.3.stdout")); err != nil {
				t.Errorf("README command %q: %v", c, err)
			}
		}
	}
}
