//go:build amd64 && !purego

package collective

import (
	"testing"

	"golang.org/x/sys/cpu"
)

// The lazy AVX2 check agrees with golang.org/x/sys/cpu's, which the package
// no longer links (its init asks the CPU at every program's start).
func TestHasAVX2MatchesSysCPU(t *testing.T) {
	if got, want := hasAVX2(), cpu.X86.HasAVX2; got != want {
		t.Fatalf("hasAVX2() = %v, golang.org/x/sys/cpu says %v", got, want)
	}
}
