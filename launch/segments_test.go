package launch

import (
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gear-rl/gear/internal/shmname"
)

// segmentsOfEveryKind writes, in a directory standing for /dev/shm, a segment
// of every kind shmname lists for each of jobs, and a few files gear did not
// make. It returns the names of each job's segments, and the foreign names.
func segmentsOfEveryKind(t *testing.T, shm string, jobs ...string) (map[string][]string, []string) {
	t.Helper()
	byJob := map[string][]string{}
	for _, job := range jobs {
		for _, k := range shmname.Kinds() {
			rest := "world.r0.0a0b"
			if k == shmname.Data {
				rest = "dqn.replay.0"
			}
			byJob[job] = append(byJob[job], shmname.Make(job, k, rest))
		}
	}
	foreign := []string{"pulse-shm-1234", "gear.cu", "sem.gear.j1.x"}
	for _, names := range append(slices.Collect(maps.Values(byJob)), foreign) {
		for _, n := range names {
			if err := os.WriteFile(filepath.Join(shm, n), []byte("0123"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	return byJob, foreign
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	e, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, x := range e {
		out = append(out, x.Name())
	}
	return out
}

func sorted(parts ...[]string) []string {
	return slices.Sorted(slices.Values(slices.Concat(parts...)))
}

// Between generations the launcher removes exactly the job's segments of the
// kinds shmname calls per generation, and at the job's end every kind: a kind
// added to shmname is found by the clean-up without a change here.
func TestRemoveSegmentsOfEveryKind(t *testing.T) {
	shm := t.TempDir()
	byJob, foreign := segmentsOfEveryKind(t, shm, "j1", "j10", "j2")
	var gen, kept []string
	for _, n := range byJob["j1"] {
		p, _ := shmname.Parse(n)
		if p.Kind.PerGeneration() {
			gen = append(gen, n)
		} else {
			kept = append(kept, n)
		}
	}
	if len(gen) == 0 || len(kept) == 0 {
		t.Fatalf("shmname lists %d per-generation and %d per-job kinds; want some of each", len(gen), len(kept))
	}
	others := sorted(byJob["j10"], byJob["j2"], foreign)

	got, err := RemoveGenerationSegments(shm, "j1")
	if err != nil || !slices.Equal(got, sorted(gen)) {
		t.Fatalf("RemoveGenerationSegments = %q, %v; want %q", got, err, sorted(gen))
	}
	if left := listDir(t, shm); !slices.Equal(left, sorted(kept, others)) {
		t.Fatalf("after RemoveGenerationSegments: %q; want %q", left, sorted(kept, others))
	}

	got, err = RemoveJobSegments(shm, "j1")
	if err != nil || !slices.Equal(got, sorted(kept)) {
		t.Fatalf("RemoveJobSegments = %q, %v; want %q", got, err, sorted(kept))
	}
	if left := listDir(t, shm); !slices.Equal(left, others) {
		t.Fatalf("after RemoveJobSegments: %q; want %q", left, others)
	}

	// Every kind at once, as at the end of a job that never restarted.
	got, err = RemoveJobSegments(shm, "j2")
	if err != nil || !slices.Equal(got, sorted(byJob["j2"])) {
		t.Fatalf("RemoveJobSegments = %q, %v; want %q", got, err, sorted(byJob["j2"]))
	}
	if got, err := RemoveJobSegments(filepath.Join(shm, "absent"), "j1"); err != nil || len(got) != 0 {
		t.Fatalf("RemoveJobSegments of a missing directory = %q, %v; want nothing", got, err)
	}
}

// `gearrun clean` (Clean) finds every kind of segment of a job that is gone,
// and leaves alone what gear did not make.
func TestCleanFindsEveryKind(t *testing.T) {
	shm, rt := t.TempDir(), t.TempDir()
	byJob, foreign := segmentsOfEveryKind(t, shm, "gone1", "gone2")
	got, err := Clean(CleanOptions{ShmDir: shm, RuntimeDir: rt})
	if want := sorted(byJob["gone1"], byJob["gone2"]); err != nil || !slices.Equal(got.Segments, want) {
		t.Fatalf("Clean removed %q, %v; want %q", got.Segments, err, want)
	}
	if !slices.Equal(got.Jobs, []string{"gone1", "gone2"}) || got.Bytes != int64(4*len(got.Segments)) {
		t.Errorf("Clean = %+v", got)
	}
	if left := listDir(t, shm); !slices.Equal(left, sorted(foreign)) {
		t.Errorf("after Clean: %q; want %q", left, sorted(foreign))
	}
}

// A launcher killed outright leaves its guard to remove the job's segments,
// of every kind, and its lock file, and nothing of other jobs.
func TestGuardRemovesEveryKind(t *testing.T) {
	shm := t.TempDir()
	byJob, foreign := segmentsOfEveryKind(t, shm, "j1", "j10", "j2")
	lock := filepath.Join(t.TempDir(), "j1.lock")
	if err := os.WriteFile(lock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGuard(shm, "j1", lock, slog.New(slog.DiscardHandler))
	g.starting.Wait()
	g.mu.Lock()
	w, proc := g.w, g.proc
	g.w, g.proc, g.closed = nil, nil, true
	g.mu.Unlock()
	if proc == nil {
		t.Skip("no shell: the guard is inert")
	}
	w.Close() // the pipe ends without "done", as when the launcher dies
	if _, err := proc.Wait(); err != nil {
		t.Fatal(err)
	}
	if want := sorted(byJob["j10"], byJob["j2"], foreign); !slices.Equal(listDir(t, shm), want) {
		t.Errorf("after the guard: %q; want %q", listDir(t, shm), want)
	}
	if _, err := os.Stat(lock); !os.IsNotExist(err) {
		t.Errorf("the guard left the lock file: %v", err)
	}
}
