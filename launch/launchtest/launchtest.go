package launchtest

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/geartest"
	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
)

// Option changes how RunRanks launches.
type Option func(*config)

type config struct {
	timeout time.Duration
	env     []string
	groups  []launch.Group
	binder  launch.Binder
	check   func(res *launch.Result, output string) error
	tune    []func(*launch.Request, *launch.Options)
}

// Tune changes the plan's request and the launch's options before the job
// starts (restarts, heartbeat, grace): what the other options do not cover.
func Tune(f func(*launch.Request, *launch.Options)) Option {
	return func(c *config) { c.tune = append(c.tune, f) }
}

// Timeout bounds the whole job (default 2 minutes); past it every rank is stopped
// and the test fails.
func Timeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// Env passes NAME=VALUE entries to every rank.
func Env(kv ...string) Option { return func(c *config) { c.env = append(c.env, kv...) } }

// Roles splits the n ranks into MPMD roles: Roles("actor", 3, "trainer", 1). The
// counts must add up to n.
func Roles(nameCount ...any) Option {
	return func(c *config) {
		for i := 0; i+1 < len(nameCount); i += 2 {
			c.groups = append(c.groups, launch.Group{Role: nameCount[i].(string), NP: nameCount[i+1].(int)})
		}
	}
}

// Binder sets the plan's device binder.
func Binder(b launch.Binder) Option { return func(c *config) { c.binder = b } }

// ExpectFailure makes RunRanks accept a job that fails, and hands the result and
// the ranks' output to check instead; check's error fails the test.
func ExpectFailure(check func(res *launch.Result, output string) error) Option {
	return func(c *config) { c.check = check }
}

var (
	callsMu sync.Mutex
	calls   = map[*testing.T]int{}
)

// callID names the k-th RunRanks call of a test run, so that a test may launch
// several jobs and each rank process runs only its own (also under -count=N,
// where every run of the test counts from 1, as in the rank processes).
func callID(t *testing.T) string {
	callsMu.Lock()
	defer callsMu.Unlock()
	calls[t]++
	return t.Name() + "#" + strconv.Itoa(calls[t])
}

// IsRank reports whether this process is a rank started by RunRanks.
func IsRank() bool { return os.Getenv(rank.EnvTestRank) != "" }

// RunRanks runs fn in n rank processes of one job (see the package comment).
func RunRanks(t *testing.T, n int, fn func(t *testing.T, w *rank.World), opts ...Option) {
	t.Helper()
	id := callID(t)
	if want := os.Getenv(rank.EnvTestRank); want != "" {
		if want == id {
			runRank(t, fn)
		}
		return
	}
	var cfg config
	cfg.timeout = 2 * time.Minute
	for _, o := range opts {
		o(&cfg)
	}
	argv := []string{os.Args[0], "-test.run=" + runPattern(t.Name()), "-test.count=1", "-test.v=true",
		"-test.timeout=" + cfg.timeout.String()}
	groups := cfg.groups
	if len(groups) == 0 {
		groups = []launch.Group{{NP: n}}
	}
	total := 0
	for i := range groups {
		groups[i].Argv = argv
		total += groups[i].NP
	}
	if total != n {
		t.Fatalf("launchtest: roles add up to %d ranks, want %d", total, n)
	}
	req := launch.Request{
		Groups:      groups,
		Env:         append([]string{rank.EnvTestRank + "=" + id}, cfg.env...),
		RdzvTimeout: cfg.timeout,
		Binder:      cfg.binder,
	}
	var out geartest.Buffer
	lopts := launch.Options{
		Stdout: &out, Stderr: &out, TagOutput: true, Timeout: cfg.timeout, Grace: 5 * time.Second,
		Name: "launchtest",
	}
	for _, f := range cfg.tune {
		f(&req, &lopts)
	}
	plan, err := launch.NewPlan(req)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout+30*time.Second)
	defer cancel()
	res, err := launch.Run(ctx, plan, lopts)
	if cfg.check != nil {
		if res == nil {
			t.Fatalf("launchtest: %v", err)
		}
		if err := cfg.check(res, out.String()); err != nil {
			t.Fatalf("launchtest: %v\nrank output:\n%s", err, out.String())
		}
		return
	}
	if err != nil {
		t.Fatalf("launchtest: %d ranks of %s: %v\nrank output:\n%s", n, t.Name(), err, out.String())
	}
}

// runRank is RunRanks inside a rank process.
func runRank(t *testing.T, fn func(t *testing.T, w *rank.World)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w, err := rank.Init(ctx)
	if err != nil {
		t.Fatalf("launchtest: rank.Init: %v", err)
	}
	defer w.Close()
	fn(t, w)
}

// runPattern is a -test.run pattern that selects exactly the test name (with
// its subtest path).
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}
