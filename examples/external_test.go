// Package examples_test builds examples/external, a Go trainer in a module of
// its own, from its own directory, as a user's repository would build it, and
// runs it under gearrun.
package examples_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// goEnv is the environment of the go commands that build other modules: the
// module's own go.mod and go.sum, whatever workspace surrounds it; a go.sum
// that lacks an entry is an error, not a download.
var goEnv = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")

// goCmd runs the go command in dir and returns its standard output.
func goCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir, cmd.Env = dir, goEnv
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, stderr.String())
	}
	return string(out)
}

func TestExternalModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module and runs two ranks")
	}
	gearrun := bins.Path(t, "gearrun")
	trainer := filepath.Join(t.TempDir(), "trainer")
	goCmd(t, "external", "build", "-o", trainer, ".")
	if m := strings.TrimSpace(goCmd(t, "external", "list", "-m")); m == "github.com/gear-rl/gear" {
		t.Fatalf("examples/external is not a module of its own: go list -m = %s", m)
	}

	out, code := jobstest.Gearrun(t, "..", gearrun, "-np", "2", trainer)
	if code != 0 {
		t.Fatalf("gearrun -np 2 trainer: exit %d\n%s", code, out)
	}
	for _, want := range []string{
		"[0] rank 0 of 2: allreduce sum 3: ok", "[1] rank 1 of 2: allreduce sum 3: ok",
		"[0] rank 0 of 2: sampled 64 items", "[1] rank 1 of 2: sampled 64 items",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "every row from its writer: ok") != 2 {
		t.Errorf("not every rank checked its collected rows:\n%s", out)
	}
}

// The README's program, in a module made the way the README says, builds and
// runs under gearrun.
func TestReadmeModuleProgram(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module and runs two ranks")
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "## Use gear from your own Go module")
	_, code, ok2 := strings.Cut(section, "```go\n")
	code, _, ok3 := strings.Cut(code, "```")
	if !ok || !ok2 || !ok3 || !strings.Contains(code, "package main") {
		t.Fatal("README.md: no Go program under \"Use gear from your own Go module\"")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sum, err := os.ReadFile("external/go.sum") // the same requirements, already summed
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"main.go": code,
		"go.mod":  "module example.com/trainer\n\ngo 1.26.8\n\nrequire github.com/gear-rl/gear v0.0.0\n\nreplace github.com/gear-rl/gear => " + root + "\n",
		"go.sum":  string(sum),
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goCmd(t, dir, "mod", "tidy")
	goCmd(t, dir, "build", "-o", "trainer", ".")
	out, code2 := jobstest.Gearrun(t, dir, bins.Path(t, "gearrun"), "-np", "3", "./trainer")
	if code2 != 0 {
		t.Fatalf("gearrun -np 3 ./trainer: exit %d\n%s", code2, out)
	}
	for r := range 3 {
		if want := fmt.Sprintf("[%d] rank %d of 3: sum of ranks = 3", r, r); !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
