package geartest

import (
	"os"

	"github.com/gear-rl/gear/rank"
)

// PrivateStateHome points XDG_STATE_HOME at a new temporary directory and
// unsets GEAR_STATE_DIR, so that the gearrun processes a test binary starts
// keep their records and checkpoints (gearrun status, --max-restarts) there
// rather than in the user's ~/.local/state/gear. Call it from TestMain before
// m.Run; the returned func removes the directory (call it after m.Run).
func PrivateStateHome() (remove func()) {
	dir, err := os.MkdirTemp("", "gear-test-state-")
	if err != nil {
		// No temporary directory: the tests that need one fail on their own.
		return func() {}
	}
	os.Setenv("XDG_STATE_HOME", dir)
	os.Unsetenv(rank.EnvStateDir)
	return func() { os.RemoveAll(dir) }
}
