package geartest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Commands builds a set of Go commands into one temporary directory, once per
// test binary: the first Path builds them all, later calls reuse the build (or
// its error). Remove deletes the directory; call it from TestMain after m.Run.
type Commands struct {
	pkgs []string

	once sync.Once
	dir  string
	err  error
}

// NewCommands describes the commands of the main packages pkgs (import paths,
// such as "github.com/gear-rl/gear/cmd/gearrun"); it builds nothing yet.
func NewCommands(pkgs ...string) *Commands { return &Commands{pkgs: pkgs} }

// Path builds the commands if that has not been done yet and returns the path
// of the one named name (the last element of its import path). A failed build
// fails t, and every later test that asks.
func (c *Commands) Path(t testing.TB, name string) string {
	t.Helper()
	c.once.Do(c.build)
	if c.err != nil {
		t.Fatal(c.err)
	}
	return filepath.Join(c.dir, name)
}

func (c *Commands) build() {
	if c.dir, c.err = os.MkdirTemp("", "gear-test-bin-"); c.err != nil {
		return
	}
	args := append([]string{"build", "-o", c.dir}, c.pkgs...)
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		c.err = fmt.Errorf("go build %s: %v\n%s", strings.Join(c.pkgs, " "), err, out)
	}
}

// Remove deletes the built commands, if any were built. It must not run while
// a test may still call Path.
func (c *Commands) Remove() {
	if c.dir != "" {
		os.RemoveAll(c.dir)
	}
}
