package roles_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/roles"
)

// TestParamVersionsAcrossRestarts: a publisher checkpointing to a file publishes
// versions 1..3000 and ends without a last write (as if killed); the publisher
// of the next generation resumes from the file: versions up to the
// reservation are refused, its first version is above every version published
// before, with the checkpointed parameters, and a reader of the new
// generation sees it.
func TestParamVersionsAcrossRestarts(t *testing.T) {
	const n, last = 64, 3000
	path := filepath.Join(t.TempDir(), "theta.param")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	w1 := collectivetest.NewWorld(1)
	t.Cleanup(func() { collectivetest.CheckNoSegments(t, w1.JobID()) })
	pub, err := roles.NewPublisher(ctx, w1.Bootstrap(0), "theta", n)
	if err != nil {
		t.Fatal(err)
	}
	if _, found, err := pub.CheckpointTo(path, time.Hour); err != nil || found {
		t.Fatalf("CheckpointTo a new file: found %v, %v", found, err)
	}
	for v := uint64(1); v <= last; v++ {
		if err := pub.Publish(ctx, v, filled(n, v)); err != nil {
			t.Fatal(err)
		}
	}
	pub.Close()
	c, err := roles.ReadParamCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	// Written when a version passed the reservation: 1, 1026, 2051.
	if c.Version != 2051 || c.Reserved < last || c.Params[0] != 2051 {
		t.Fatalf("checkpoint: version %d, reserved %d, params[0] %v; want 2051, >= %d, 2051", c.Version, c.Reserved, c.Params[0], last)
	}

	w2 := collectivetest.NewWorld(2)
	t.Cleanup(func() { collectivetest.CheckNoSegments(t, w2.JobID()) })
	pub2, err := roles.NewPublisher(ctx, w2.Bootstrap(0), "theta", n)
	if err != nil {
		t.Fatal(err)
	}
	defer pub2.Close()
	got, found, err := pub2.CheckpointTo(path, time.Hour)
	if err != nil || !found || got.Reserved != c.Reserved {
		t.Fatalf("resume: %+v %v %v", got.Reserved, found, err)
	}
	if err := pub2.Publish(ctx, last, filled(n, last)); !errors.Is(err, roles.ErrStaleVersion) {
		t.Fatalf("publish of version %d after resuming: %v, want ErrStaleVersion", last, err)
	}
	first := got.Reserved + 1
	if err := pub2.Publish(ctx, first, got.Params); err != nil {
		t.Fatal(err)
	}
	r, err := roles.NewReader(ctx, w2.Bootstrap(1), "theta", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Latest(ctx); err != nil {
		t.Fatal(err)
	}
	if r.Version() != first || r.Version() <= last || r.Params()[0] != 2051 {
		t.Fatalf("reader of the new generation: version %d, params[0] %v; want %d (> %d), 2051", r.Version(), r.Params()[0], first, last)
	}
	// The new generation's first version passed no reservation of its own
	// yet: the checkpoint moves ahead with it.
	if c2, err := roles.ReadParamCheckpoint(path); err != nil || c2.Version != first || c2.Reserved <= first {
		t.Fatalf("checkpoint after the first publish: %+v, %v", c2, err)
	}

	// A damaged or missing file is refused, and says which.
	b, _ := os.ReadFile(path)
	b[40] ^= 1
	os.WriteFile(path, b, 0o600)
	if _, err := roles.ReadParamCheckpoint(path); err == nil {
		t.Fatal("a damaged checkpoint read back")
	}
	if _, err := roles.ReadParamCheckpoint(path + ".none"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing checkpoint: %v", err)
	}
}
