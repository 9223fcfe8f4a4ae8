package nccl_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"gear/collective"
	"gear/gmi"
)

// Helpers shared by this package's tests: the inputs and serial references of
// package collective's shared suite (small integers, so that every reduction
// order gives the exact result), and the layout helpers of its layout tests.

var allOps = []collective.Op{collective.Sum, collective.Prod, collective.Min, collective.Max}

// input is element i of rank's data: small integers of period 5 in i (period 256
// for bytes), so that references can be tabulated.
func input[T collective.Elem](rank, i int) T {
	if isBytes[T]() {
		return T(rank*31 + i*7)
	}
	return T((rank*7+i*13)%5 - 2)
}

func isBytes[T collective.Elem]() bool {
	var z T
	_, ok := any(z).(byte)
	return ok
}

func period[T collective.Elem]() int {
	if isBytes[T]() {
		return 256
	}
	return 5
}

func fill[T collective.Elem](buf []T, rank, offset int) {
	p := period[T]()
	tab := make([]T, p)
	for k := range tab {
		tab[k] = input[T](rank, offset+k)
	}
	for i := range buf {
		buf[i] = tab[i%p]
	}
}

// inputs returns rank's input as a function of i, from a table.
func inputs[T collective.Elem](rank int) func(i int) T {
	p := period[T]()
	tab := make([]T, p)
	for k := range tab {
		tab[k] = input[T](rank, k)
	}
	return func(i int) T { return tab[i%p] }
}

// references returns the reduction over n ranks as a function of i, from a table.
func references[T collective.Number](n int, op collective.Op) func(i int) T {
	tab := make([]T, 5)
	for k := range tab {
		tab[k] = reference[T](n, k, op)
	}
	return func(i int) T { return tab[i%5] }
}

func apply[T collective.Number](op collective.Op, a, b T) T {
	switch op {
	case collective.Sum:
		return a + b
	case collective.Prod:
		return a * b
	case collective.Min:
		return min(a, b)
	}
	return max(a, b)
}

// reference is the reduction of element i over ranks 0..n-1, computed serially.
func reference[T collective.Number](n, i int, op collective.Op) T {
	acc := input[T](0, i)
	for r := 1; r < n; r++ {
		acc = apply(op, acc, input[T](r, i))
	}
	return acc
}

func typeName[T collective.Elem]() string {
	var z T
	return fmt.Sprintf("%T", z)
}

func compare[T collective.Elem](what string, got []T, want func(i int) T) error {
	for i, v := range got {
		if w := want(i); v != w {
			return fmt.Errorf("%s: element %d of %d is %v, want %v", what, i, len(got), v, w)
		}
	}
	return nil
}

// evenRows reports whether every GPU holds the same number of GMIs (multi-ring
// needs it).
func evenRows(m gmi.Mapping) bool {
	for _, row := range m {
		if len(row) != len(m[0]) {
			return false
		}
	}
	return true
}

// buildLayouts builds a layout of m on every communicator at once; opts gives
// each rank's options. Layouts are closed when the test ends.
func buildLayouts(t *testing.T, comms []*collective.Comm, m func(r int) gmi.Mapping, opts func(r int) []collective.LayoutOption) ([]*collective.Layout, []error) {
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

// layoutCase runs LayoutAllReduce of count elements of T by op on every rank and
// checks the result against the serial reference.
func layoutCase[T collective.Number](count int, op collective.Op) func(ctx context.Context, l *collective.Layout, r int) error {
	return func(ctx context.Context, l *collective.Layout, r int) error {
		buf := make([]T, count)
		fill(buf, r, 0)
		if err := collective.LayoutAllReduce(ctx, l, buf, op); err != nil {
			return err
		}
		return compare(fmt.Sprintf("%s %v count %d", typeName[T](), op, count), buf, references[T](l.Comm().Size(), op))
	}
}

// eachRank runs fn on every rank at once and fails t with every rank's error.
func eachRank(t *testing.T, n int, fn func(ctx context.Context, r int) error) {
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

func eachLayout(t *testing.T, ls []*collective.Layout, fn func(ctx context.Context, l *collective.Layout, r int) error) {
	t.Helper()
	eachRank(t, len(ls), func(ctx context.Context, r int) error { return fn(ctx, ls[r], r) })
}
