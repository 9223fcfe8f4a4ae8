package collectivetest

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/internal/shmname"
)

// Transports that Run can build worlds over.
const (
	Loopback = "loopback" // collective.Loopback: frames pass as Go slices
	Shm      = "shm"      // shared memory between goroutines of this process
	TCP      = "tcp"      // TCP over 127.0.0.1
	Auto     = "auto"     // the automatic choice from Config.Hosts
)

// Transports lists the three transports every collective test runs over.
var Transports = []string{Loopback, Shm, TCP}

// Config describes a world for Run.
type Config struct {
	Transport string   // Loopback, Shm, TCP or Auto; "" is Loopback
	Hosts     []string // host identity per rank; nil: one host
	Tuning    *collective.Tuning
	Timeout   time.Duration // for building the world and for each rank's function; 0: 60s
	Options   []collective.Option
}

// Comms builds an n-rank world over cfg's transport and returns its
// communicators, closed (and checked for leftovers) when t ends.
func Comms(t testing.TB, n int, cfg Config) ([]*collective.Comm, *World) {
	t.Helper()
	w := NewWorld(n, cfg.Hosts...)
	opts := append([]collective.Option(nil), cfg.Options...)
	switch cfg.Transport {
	case "", Loopback:
		opts = append(opts, collective.WithLoopback(collective.NewLoopback()))
	case Shm:
		opts = append(opts, collective.WithTransport(collective.TransportShm))
	case TCP:
		opts = append(opts, collective.WithTransport(collective.TransportTCP))
	case Auto:
	default:
		t.Fatalf("collectivetest: unknown transport %q", cfg.Transport)
	}
	if cfg.Tuning != nil {
		opts = append(opts, collective.WithTuning(*cfg.Tuning))
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	comms := make([]*collective.Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { comms[r], errs[r] = collective.New(ctx, w.Bootstrap(r), opts...) })
	}
	wg.Wait()
	t.Cleanup(func() {
		CloseAll(comms)
		CheckNoSegments(t, w.JobID())
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: New: %v", r, err)
		}
	}
	return comms, w
}

// Run builds an n-rank world (Comms) and runs fn on every rank concurrently; it
// fails t with every rank's error.
func Run(t testing.TB, n int, cfg Config, fn func(ctx context.Context, c *collective.Comm) error) {
	t.Helper()
	comms, _ := Comms(t, n, cfg)
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if errs := Each(ctx, comms, fn); errs != nil {
		for r, err := range errs {
			if err != nil {
				t.Errorf("rank %d: %v", r, err)
			}
		}
		t.FailNow()
	}
}

// Each runs fn on every communicator concurrently and returns the errors by rank,
// or nil when all succeeded.
func Each(ctx context.Context, comms []*collective.Comm, fn func(ctx context.Context, c *collective.Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = fn(ctx, c) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	return nil
}

// CloseAll closes communicators concurrently (a TCP communicator waits briefly for
// its peers' goodbyes).
func CloseAll(comms []*collective.Comm) {
	var wg sync.WaitGroup
	for _, c := range comms {
		if c != nil {
			wg.Go(func() { c.Close() })
		}
	}
	wg.Wait()
}

// CheckNoSegments fails t if /dev/shm holds segments of job.
func CheckNoSegments(t testing.TB, job string) {
	t.Helper()
	if left := Segments(job); len(left) > 0 {
		t.Errorf("shared memory left behind: %s", strings.Join(left, ", "))
		for _, name := range left {
			os.Remove("/dev/shm/" + name)
		}
	}
}

// Segments lists the /dev/shm entries of job.
func Segments(job string) []string {
	ents, err := os.ReadDir("/dev/shm")
	if err != nil {
		return nil
	}
	var out []string
	prefix := shmname.Name(job, "")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}
