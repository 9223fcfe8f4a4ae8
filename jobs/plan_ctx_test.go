package jobs

import (
	"context"
	"errors"
	"testing"

	"github.com/gear-rl/gear/gmi"
)

// TestRequestDiscoversUnderCtx pins that Request looks for GPUs under the
// caller's ctx: a cancelled ctx ends the discovery with the context's error.
func TestRequestDiscoversUnderCtx(t *testing.T) {
	t.Setenv(gmi.EnvTopology, "")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	s := parseSpec(t, "[launch]\nnp = 2\ngpus_per_rank = 1\ncommand = [\"x\"]\n")
	if _, err := s.Request(ctx, ""); !errors.Is(err, context.Canceled) {
		t.Fatalf("Request under a cancelled ctx = %v, want context.Canceled", err)
	}
	if _, err := s.Plan(ctx, ""); !errors.Is(err, context.Canceled) {
		t.Fatalf("Plan under a cancelled ctx = %v, want context.Canceled", err)
	}
}
