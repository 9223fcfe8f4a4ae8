package dist

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestOrphans: with 2 trainers left of 5, trainer 0 takes the checkpoints of
// old trainers 2 and 4, trainer 1 that of 3; nobody takes 0 or 1 (their own).
func TestOrphans(t *testing.T) {
	dir := t.TempDir()
	for j := range 5 {
		os.WriteFile(shardCheckpoint(dir, "replay", j), nil, 0o600)
	}
	os.WriteFile(filepath.Join(dir, "other.shard.7.ckpt"), nil, 0o600)
	got0 := orphans(dir, "replay", 2, 0)
	got1 := orphans(dir, "replay", 2, 1)
	want0 := []string{shardCheckpoint(dir, "replay", 2), shardCheckpoint(dir, "replay", 4)}
	if !slices.Equal(got0, want0) || !slices.Equal(got1, []string{shardCheckpoint(dir, "replay", 3)}) {
		t.Fatalf("orphans: %v, %v", got0, got1)
	}
	if o := orphans(dir, "replay", 5, 0); len(o) != 0 {
		t.Fatalf("orphans with as many trainers as checkpoints: %v", o)
	}
}

// TestKeysAndLabels: actors' keys differ across generations and actors, and a
// checkpoint label reads back.
func TestKeysAndLabels(t *testing.T) {
	seen := map[uint64]bool{}
	for gen := range 3 {
		for a := range 4 {
			k := actorKeyBase(gen, a)
			if seen[k] || k&(1<<40-1) != 0 {
				t.Fatalf("key base %x of generation %d, actor %d", k, gen, a)
			}
			seen[k] = true
		}
	}
	if got := describeLabel(checkpointLabel(3, 2, 1)); got != "generation 3, trainer 1 of 2" {
		t.Fatalf("label: %q", got)
	}
}
