package launch

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// fakeGenerations is a launch path without processes: generation g ends as
// ending(g) says, and it keeps the job's account as a path does.
type fakeGenerations struct {
	ending func(gen int) Ending
	// inRun, if set, runs as generation gen's world stops, before decide.
	inRun func(ctx context.Context, gen int)
	// next says what the next world after generation gen is; ok false: none.
	next func(gen int) (string, bool)
	// decideTwice calls decide twice, as RunOnHosts may (once settled,
	// once its connections ended).
	decideTwice bool
	// endAfterVerdict: what came after the verdict (a signal) ends the job.
	endAfterVerdict bool
	// noDecide returns true without calling decide.
	noDecide bool

	gen            int    // the generation running
	gens           []int  // the generations run
	cause          string // the job's cause, as the path keeps it
	stopped, nexts int    // calls of Stopped and Next
}

func (f *fakeGenerations) RunGeneration(ctx context.Context, gen int, decide func(Ending) bool) bool {
	f.gen = gen
	f.gens = append(f.gens, gen)
	e := f.ending(gen)
	f.cause = e.Cause
	if f.inRun != nil {
		f.inRun(ctx, gen)
	}
	if f.noDecide {
		return true
	}
	again := decide(e)
	if f.decideTwice && decide(e) != again {
		panic("decide changed its answer")
	}
	return again && !f.endAfterVerdict
}

func (f *fakeGenerations) Stopped(ctx context.Context) bool {
	f.stopped++
	if err := ctx.Err(); err != nil {
		f.cause = "job stopped: " + err.Error()
		return true
	}
	return false
}

func (f *fakeGenerations) Next(context.Context) (string, bool) {
	f.nexts++
	if f.next == nil {
		return "", true
	}
	next, ok := f.next(f.gen)
	if !ok {
		f.cause += "; " + next
	}
	return next, ok
}

func rankFailed(gen int) Ending {
	return Ending{Cause: fmt.Sprintf("rank 1 (pid %d) exited with status 3", 100+gen), Restartable: true}
}

func TestRestartLine(t *testing.T) {
	for _, tc := range []struct {
		name        string
		n, max      int
		cause, next string
		want        string
	}{
		{"gearrun", 1, 3, "rank 1 (pid 123) exited with status 3", "", "gearrun: restart 1 of 3: rank 1 (pid 123) exited with status 3"},
		{"gearrun", 1, 1, "host h2 (ranks 2-3) lost: ssh exited with status 255", "next world: 2 ranks on h1",
			"gearrun: restart 1 of 1: host h2 (ranks 2-3) lost: ssh exited with status 255; next world: 2 ranks on h1"},
		{"gearrun", 2, 2, "lost rank 2 on n2: no word", "node n2 lost; next world: 4 ranks on n1,n3",
			"gearrun: restart 2 of 2: lost rank 2 on n2: no word; node n2 lost; next world: 4 ranks on n1,n3"},
		{"myrun", 3, 5, "rank 0 (pid 9, learner 0) killed by SIGKILL", "", "myrun: restart 3 of 5: rank 0 (pid 9, learner 0) killed by SIGKILL"},
	} {
		if got := RestartLine(tc.name, tc.n, tc.max, tc.cause, tc.next); got != tc.want {
			t.Errorf("RestartLine(%q, %d, %d, %q, %q) = %q, want %q", tc.name, tc.n, tc.max, tc.cause, tc.next, got, tc.want)
		}
	}
}

func TestRestartLoop(t *testing.T) {
	for _, tc := range []struct {
		name string
		max  int
		gens *fakeGenerations
		// cancel: the ctx ends as generation cancelAt's world stops (-1: never).
		cancelAt int

		wantGens     int
		wantRestarts int
		wantLines    []string
		wantCause    string // "" for the last generation's own
		wantStopped  int
		wantNexts    int
	}{
		{
			name: "budget spent", max: 2, gens: &fakeGenerations{ending: rankFailed}, cancelAt: -1,
			wantGens: 3, wantRestarts: 2, wantStopped: 2, wantNexts: 2,
			wantLines: []string{
				"job: restart 1 of 2: rank 1 (pid 100) exited with status 3",
				"job: restart 2 of 2: rank 1 (pid 101) exited with status 3",
			},
		},
		{
			name: "no restarts allowed", max: 0, gens: &fakeGenerations{ending: rankFailed}, cancelAt: -1,
			wantGens: 1,
		},
		{
			name: "the world succeeds after a restart", max: 3, cancelAt: -1,
			gens: &fakeGenerations{ending: func(gen int) Ending {
				if gen == 1 {
					return Ending{}
				}
				return rankFailed(gen)
			}},
			wantGens: 2, wantRestarts: 1, wantStopped: 1, wantNexts: 1,
			wantLines: []string{"job: restart 1 of 3: rank 1 (pid 100) exited with status 3"},
		},
		{
			name: "the launcher's own failure ends at once", max: 3, cancelAt: -1,
			gens: &fakeGenerations{ending: func(int) Ending {
				return Ending{Cause: "program ./x does not exist"}
			}},
			wantGens: 1,
		},
		{
			name: "cancelled between generations", max: 3, cancelAt: 1, gens: &fakeGenerations{ending: rankFailed},
			wantGens: 2, wantRestarts: 1, wantStopped: 2, wantNexts: 1,
			wantLines: []string{"job: restart 1 of 3: rank 1 (pid 100) exited with status 3"},
			wantCause: "job stopped: context canceled",
		},
		{
			name: "the next world named", max: 1, cancelAt: -1,
			gens: &fakeGenerations{ending: rankFailed, next: func(gen int) (string, bool) {
				return fmt.Sprintf("next world: %d ranks on h1", 2-gen), true
			}},
			wantGens: 2, wantRestarts: 1, wantStopped: 1, wantNexts: 1,
			wantLines: []string{"job: restart 1 of 1: rank 1 (pid 100) exited with status 3; next world: 2 ranks on h1"},
		},
		{
			name: "no world left", max: 3, cancelAt: -1,
			gens: &fakeGenerations{ending: rankFailed, next: func(gen int) (string, bool) {
				if gen == 1 {
					return "no host is left", false
				}
				return "", true
			}},
			wantGens: 2, wantRestarts: 1, wantStopped: 2, wantNexts: 2,
			wantLines: []string{"job: restart 1 of 3: rank 1 (pid 100) exited with status 3"},
			wantCause: "rank 1 (pid 101) exited with status 3; no host is left",
		},
		{
			name: "decided twice, said once", max: 2, cancelAt: -1, gens: &fakeGenerations{ending: rankFailed, decideTwice: true},
			wantGens: 3, wantRestarts: 2, wantStopped: 2, wantNexts: 2,
			wantLines: []string{
				"job: restart 1 of 2: rank 1 (pid 100) exited with status 3",
				"job: restart 2 of 2: rank 1 (pid 101) exited with status 3",
			},
		},
		{
			name: "a signal after the verdict", max: 2, cancelAt: -1, gens: &fakeGenerations{ending: rankFailed, endAfterVerdict: true},
			wantGens: 1, wantRestarts: 0, wantStopped: 1, wantNexts: 1,
			wantLines: []string{"job: restart 1 of 2: rank 1 (pid 100) exited with status 3"},
		},
		{
			name: "no decision", max: 2, cancelAt: -1, gens: &fakeGenerations{ending: rankFailed, noDecide: true},
			wantGens: 1,
		},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "-"), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			g := tc.gens
			g.inRun = func(_ context.Context, gen int) {
				if gen == tc.cancelAt {
					cancel()
				}
			}
			var out strings.Builder
			l := &RestartLoop{Name: "job", Max: tc.max, Out: &out}
			l.Run(ctx, g)
			var lines []string
			if s := strings.TrimSuffix(out.String(), "\n"); s != "" {
				lines = strings.Split(s, "\n")
			}
			if len(g.gens) != tc.wantGens || l.Restarts() != tc.wantRestarts ||
				strings.Join(lines, "\n") != strings.Join(tc.wantLines, "\n") {
				t.Errorf("generations %v, %d restarts, lines:\n%s\nwant %d generations, %d restarts, lines:\n%s",
					g.gens, l.Restarts(), out.String(), tc.wantGens, tc.wantRestarts, strings.Join(tc.wantLines, "\n"))
			}
			for i, gen := range g.gens {
				if gen != i {
					t.Errorf("generation %d run as %d: %v", i, gen, g.gens)
				}
			}
			if g.stopped != tc.wantStopped || g.nexts != tc.wantNexts {
				t.Errorf("Stopped called %d times, Next %d; want %d and %d", g.stopped, g.nexts, tc.wantStopped, tc.wantNexts)
			}
			if tc.wantCause != "" && g.cause != tc.wantCause {
				t.Errorf("cause %q, want %q", g.cause, tc.wantCause)
			}
			for i, line := range lines {
				if want := RestartLine("job", i+1, tc.max, fmt.Sprintf("rank 1 (pid %d) exited with status 3", 100+i), ""); !strings.HasPrefix(line, want) {
					t.Errorf("line %d %q is not RestartLine's %q", i, line, want)
				}
			}
		})
	}
}
