package sample

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if name := os.Getenv(detachingOwnerEnv); name != "" {
		os.Exit(detachingOwner(name)) // a child process of TestShardTableCloseWritesTimesSampled
	}
	goleak.VerifyTestMain(m)
}
