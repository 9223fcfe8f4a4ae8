package main

import (
	"os"
	"testing"

	"github.com/gear-rl/gear/rank"
)

// TestHelloAlone runs hello as a world of one (the multi-rank run is exercised by
// package launch, which builds and launches this package with 2 ranks).
func TestHelloAlone(t *testing.T) {
	for _, name := range []string{rank.EnvRank, rank.EnvWorldSize, rank.EnvSlurmProcID} {
		if _, ok := os.LookupEnv(name); ok {
			t.Setenv(name, "")
			os.Unsetenv(name)
		}
	}
	if err := run(); err != nil {
		t.Fatal(err)
	}
}
