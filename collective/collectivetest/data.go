package collectivetest

import (
	"fmt"

	"github.com/gear-rl/gear/collective"
)

// The inputs and serial references of the collective suites: element i of a
// rank's data is a small integer of period 5 in i (period 256 for bytes), so
// that every reduction order gives the exact result and references can be
// tabulated.

// Ops are the reductions, in the order the suites run them.
var Ops = []collective.Op{collective.Sum, collective.Prod, collective.Min, collective.Max}

// Input is element i of rank's data.
func Input[T collective.Elem](rank, i int) T {
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

// Fill sets buf to rank's data from element offset on.
func Fill[T collective.Elem](buf []T, rank, offset int) {
	p := period[T]()
	tab := make([]T, p)
	for k := range tab {
		tab[k] = Input[T](rank, offset+k)
	}
	for i := range buf {
		buf[i] = tab[i%p]
	}
}

// Inputs returns rank's data as a function of i, from a table.
func Inputs[T collective.Elem](rank int) func(i int) T {
	p := period[T]()
	tab := make([]T, p)
	for k := range tab {
		tab[k] = Input[T](rank, k)
	}
	return func(i int) T { return tab[i%p] }
}

// References returns the reduction by op over ranks 0..n-1 as a function of i,
// from a table.
func References[T collective.Number](n int, op collective.Op) func(i int) T {
	tab := make([]T, 5)
	for k := range tab {
		tab[k] = Reference[T](n, k, op)
	}
	return func(i int) T { return tab[i%5] }
}

// Apply is a op b.
func Apply[T collective.Number](op collective.Op, a, b T) T {
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

// Reference is the reduction by op of element i over ranks 0..n-1, computed
// serially.
func Reference[T collective.Number](n, i int, op collective.Op) T {
	acc := Input[T](0, i)
	for r := 1; r < n; r++ {
		acc = Apply(op, acc, Input[T](r, i))
	}
	return acc
}

// TypeName is the name of T, for messages.
func TypeName[T collective.Elem]() string {
	var z T
	return fmt.Sprintf("%T", z)
}

// Compare returns an error naming what and the first element of got that is
// not want(i).
func Compare[T collective.Elem](what string, got []T, want func(i int) T) error {
	for i, v := range got {
		if w := want(i); v != w {
			return fmt.Errorf("%s: element %d of %d is %v, want %v", what, i, len(got), v, w)
		}
	}
	return nil
}
