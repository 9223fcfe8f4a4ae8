// Package statehome gives a test binary a state directory of its own. It is
// apart from internal/geartest because it needs rank's names, and rank's own
// tests use geartest.
package statehome

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/gear-rl/gear/rank"
)

// Private points XDG_STATE_HOME at a new temporary directory and
// unsets GEAR_STATE_DIR, so that the gearrun processes a test binary starts
// keep their records and checkpoints (gearrun status, --max-restarts) there
// rather than in the user's ~/.local/state/gear. Call it from TestMain before
// m.Run; the returned func removes the directory (call it after m.Run). A
// test binary that ends itself with os.Exit inside a test never calls it:
// such a run should not call Private.
//
// A test binary that a test runs again (as a helper, as gearrun) inherits
// its parent's directory, which the parent removes.
func Private() (remove func()) {
	if d := os.Getenv("XDG_STATE_HOME"); strings.HasPrefix(filepath.Base(d), prefix) && os.Getenv(rank.EnvStateDir) == "" {
		return func() {}
	}
	dir, err := os.MkdirTemp("", prefix+"*")
	if err != nil {
		// No temporary directory: the tests that need one fail on their own.
		return func() {}
	}
	os.Setenv("XDG_STATE_HOME", dir)
	os.Unsetenv(rank.EnvStateDir)
	return func() { os.RemoveAll(dir) }
}

// prefix starts the name of the directories Private makes.
const prefix = "gear-test-state-"
