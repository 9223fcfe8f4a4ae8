// Package examples_test builds examples/external, a Go trainer in a module of
// its own, from its own directory, as a user's repository would build it, and
// runs it under gearrun.
package examples_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/geartest"
	"github.com/gear-rl/gear/jobs/jobstest"
)

var bins = geartest.NewCommands("github.com/gear-rl/gear/cmd/gearrun")

func TestMain(m *testing.M) {
	code := m.Run()
	bins.Remove()
	os.Exit(code)
}

func TestExternalModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module and runs two ranks")
	}
	gearrun := bins.Path(t, "gearrun")
	trainer := filepath.Join(t.TempDir(), "trainer")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", trainer, ".")
	build.Dir = "external"
	// The module's own go.mod and go.sum, whatever workspace surrounds it;
	// a go.sum that lacks an entry is an error, not a download.
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build in examples/external: %v\n%s", err, out)
	}
	list := exec.CommandContext(ctx, "go", "list", "-m")
	list.Dir, list.Env = "external", build.Env
	if out, err := list.Output(); err != nil || strings.TrimSpace(string(out)) == "github.com/gear-rl/gear" {
		t.Fatalf("examples/external is not a module of its own: go list -m: %q %v", out, err)
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
