package collectivetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/gmi"
)

// EvenRows reports whether every GPU of m holds the same number of GMIs
// (multi-ring needs it).
func EvenRows(m gmi.Mapping) bool {
	for _, row := range m {
		if len(row) != len(m[0]) {
			return false
		}
	}
	return true
}

// BuildLayouts builds a layout on every communicator at once, rank r's of
// mapping m(r) with options opts(r), and returns each rank's layout and error.
// The layouts are closed when the test ends.
func BuildLayouts(t testing.TB, comms []*collective.Comm, m func(r int) gmi.Mapping, opts func(r int) []collective.LayoutOption) ([]*collective.Layout, []error) {
	t.Helper()
	ls := make([]*collective.Layout, len(comms))
	errs := make([]error, len(comms))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { ls[r], errs[r] = collective.NewLayout(ctx, c, m(r), opts(r)...) })
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, l := range ls {
			if l != nil {
				l.Close()
			}
		}
	})
	return ls, errs
}

// LayoutCase runs LayoutAllReduce of count elements of T by op on a rank and
// checks the result against the serial reference.
func LayoutCase[T collective.Number](count int, op collective.Op) func(ctx context.Context, l *collective.Layout, r int) error {
	return func(ctx context.Context, l *collective.Layout, r int) error {
		buf := make([]T, count)
		Fill(buf, r, 0)
		if err := collective.LayoutAllReduce(ctx, l, buf, op); err != nil {
			return err
		}
		return Compare(fmt.Sprintf("%s %v count %d", TypeName[T](), op, count), buf, References[T](l.Comm().Size(), op))
	}
}

// EachRank runs fn for ranks 0..n-1 at once (30 s at most) and fails t with
// every rank's error.
func EachRank(t testing.TB, n int, fn func(ctx context.Context, r int) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { errs[r] = fn(ctx, r) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// EachLayout is EachRank with each rank's layout.
func EachLayout(t testing.TB, ls []*collective.Layout, fn func(ctx context.Context, l *collective.Layout, r int) error) {
	t.Helper()
	EachRank(t, len(ls), func(ctx context.Context, r int) error { return fn(ctx, ls[r], r) })
}
