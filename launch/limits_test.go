package launch

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gear-rl/gear/rank"
)

func TestNewPlanBounds(t *testing.T) {
	notGo := func(string) bool { return false }
	for _, tc := range []struct {
		name string
		req  Request
		want string
	}{
		{"huge np", Request{Groups: []Group{{NP: 99999999999, Argv: []string{"x"}}}}, "-np 99999999999: a job has at most 65536 ranks"},
		{"over the cap by one", Request{Groups: []Group{{NP: rank.MaxWorldSize + 1, Argv: []string{"x"}}}}, "a job has at most 65536 ranks"},
		{"groups add up", Request{Groups: []Group{{NP: 40000, Argv: []string{"a"}}, {NP: 30000, Argv: []string{"b"}}}}, "group 1: -np 30000: the groups' ranks (40000 + 30000) add up to more than the 65536"},
		{"groups overflow", Request{Groups: []Group{{NP: 1, Argv: []string{"a"}}, {NP: int(^uint(0) >> 1), Argv: []string{"b"}}}}, "add up to more than the 65536"},
		{"zero", Request{Groups: []Group{{NP: 0, Argv: []string{"x"}}}}, "-np 0: want at least 1"},
		{"negative rdzv timeout", Request{Groups: []Group{{NP: 1, Argv: []string{"x"}}}, RdzvTimeout: -time.Second}, "rendezvous timeout -1s: must not be negative"},
	} {
		tc.req.IsGoPackage = notGo
		_, err := NewPlan(tc.req)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: NewPlan error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
	p, err := NewPlan(Request{Groups: []Group{{NP: rank.MaxWorldSize, Argv: []string{"x"}}}, IsGoPackage: notGo})
	if err != nil || p.Size() != rank.MaxWorldSize {
		t.Fatalf("a plan of exactly rank.MaxWorldSize ranks: %v", err)
	}
}

func TestRunRefusesNegativeDurations(t *testing.T) {
	p := shPlan(t, 1, "true")
	for _, opts := range []Options{{Timeout: -5 * time.Second}, {Grace: -time.Second}} {
		opts.RuntimeDir = t.TempDir()
		if _, err := Run(t.Context(), p, opts); err == nil || !strings.Contains(err.Error(), "must not be negative") {
			t.Errorf("Run with %+v: %v", opts, err)
		}
	}
}

// TestCleanStale checks which jobs a launch takes for gone: only those whose
// lock file in its runtime directory is unheld and names an ended launcher (or
// none, and is old), and "local-<pid>" jobs whose process ended.
func TestCleanStale(t *testing.T) {
	shm, rt := t.TempDir(), t.TempDir()
	live, err := rank.LockJob(rt, "live", true)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	write := func(path, data string) {
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A launcher that ended without removing its lock: a PID that is not running.
	write(filepath.Join(rt, "dead.lock"), "999999999\n")
	// A lock of ranks without a launcher, unheld for long, and one just made.
	write(filepath.Join(rt, "oldshared.lock"), "")
	old := time.Now().Add(-time.Minute)
	os.Chtimes(filepath.Join(rt, "oldshared.lock"), old, old)
	write(filepath.Join(rt, "newshared.lock"), "")
	// A lock naming a running process (this one) that holds no lock: kept.
	write(filepath.Join(rt, "pidalive.lock"), strconv.Itoa(os.Getpid())+"\n")
	for _, job := range []string{"live", "dead", "oldshared", "newshared", "pidalive", "unknown", "local-999999999", rank.LocalJobID()} {
		write(filepath.Join(shm, rank.SegmentName(job, "seg")), "0123456789")
	}
	got, err := CleanStale(shm, rt)
	if err != nil {
		t.Fatal(err)
	}
	wantGone := []string{"dead", "local-999999999", "oldshared"}
	if strings.Join(got.Jobs, ",") != strings.Join(wantGone, ",") {
		t.Errorf("jobs cleaned %v, want %v", got.Jobs, wantGone)
	}
	if got.Bytes != 30 || len(got.Segments) != 3 {
		t.Errorf("cleaned %d segments of %d bytes, want 3 of 30", len(got.Segments), got.Bytes)
	}
	for _, job := range []string{"live", "newshared", "pidalive", "unknown", rank.LocalJobID()} {
		if _, err := os.Stat(filepath.Join(shm, rank.SegmentName(job, "seg"))); err != nil {
			t.Errorf("segment of %s removed: %v", job, err)
		}
	}
	for _, lock := range []string{"dead", "oldshared"} {
		if _, err := os.Stat(filepath.Join(rt, lock+".lock")); err == nil {
			t.Errorf("stale lock %s kept", lock)
		}
	}
	for _, lock := range []string{"live", "newshared", "pidalive"} {
		if _, err := os.Stat(filepath.Join(rt, lock+".lock")); err != nil {
			t.Errorf("lock %s removed", lock)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 3 << 29: "1.5 GiB", 2 << 20: "2.0 MiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
