package collective

import "unsafe"

// kernel computes out[i] = a[i] op b[i] over whole elements of one type. out may be
// a or b (the same slice); any other overlap is not allowed. The three slices have
// the same length in bytes, a multiple of the element size.
//
// The kernels are plain Go, unrolled by eight with the bounds checks hoisted, so
// that the compiler emits straight-line scalar code per element; the benchmarks in
// reduce_test.go compare them with copy.
type kernel func(out, a, b []byte)

// kernelFor returns the kernel for op over elements of type d, or nil when d has no
// arithmetic (Bytes) or op is unknown: the assembly kernel where there is one
// for this CPU (reduce_amd64.go), else the Go one.
func kernelFor(d DType, op Op) kernel {
	if int(d) >= len(kernelTable[0]) || int(op) >= len(kernelTable[0][0]) {
		return nil
	}
	return kernelTable[0][d][op]
}

// streamKernel returns the kernel for d and op whose stores bypass the cache,
// or nil (reduce_amd64.go makes them).
func streamKernel(d DType, op Op) kernel {
	if int(d) >= len(kernelTable[1]) || int(op) >= len(kernelTable[1][0]) {
		return nil
	}
	return kernelTable[1][d][op]
}

// The kernels of every element type and reduction, made once: a call picks its
// kernel by index, without allocating the closures anew (a small AllReduce that
// allocated on every call made the garbage collector run under the collectives).
var kernelTable = buildKernels() // [streaming][dtype][op]

func buildKernels() (t [2][Float64 + 1][Max + 1]kernel) {
	for d := range t[0] {
		for op := range t[0][d] {
			k := simdKernel(DType(d), Op(op))
			if k == nil {
				k = kernelGo(DType(d), Op(op))
			}
			t[0][d][op] = k
			t[1][d][op] = makeStreamKernel(DType(d), Op(op))
		}
	}
	return t
}

// kernelGo returns the Go kernel for op over elements of type d.
func kernelGo(d DType, op Op) kernel {
	switch d {
	case Float32:
		return pick[float32](op)
	case Float64:
		return pick[float64](op)
	case Int32:
		return pick[int32](op)
	case Int64:
		return pick[int64](op)
	}
	return nil
}

func pick[T Number](op Op) kernel {
	switch op {
	case Sum:
		return func(out, a, b []byte) { sum3(view[T](out), view[T](a), view[T](b)) }
	case Prod:
		return func(out, a, b []byte) { prod3(view[T](out), view[T](a), view[T](b)) }
	case Min:
		return func(out, a, b []byte) { min3(view[T](out), view[T](a), view[T](b)) }
	case Max:
		return func(out, a, b []byte) { max3(view[T](out), view[T](a), view[T](b)) }
	}
	return nil
}

// view reinterprets b as elements of T. b's address must be aligned for T: user
// slices are, and every transport hands out 8-byte aligned payloads.
func view[T Number](b []byte) []T {
	if len(b) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(z)))
}

func sum3[T Number](out, a, b []T) {
	n := len(out)
	a, b = a[:n], b[:n]
	i := 0
	for ; i+8 <= n; i += 8 {
		o, x, y := (*[8]T)(out[i:]), (*[8]T)(a[i:]), (*[8]T)(b[i:])
		o[0] = x[0] + y[0]
		o[1] = x[1] + y[1]
		o[2] = x[2] + y[2]
		o[3] = x[3] + y[3]
		o[4] = x[4] + y[4]
		o[5] = x[5] + y[5]
		o[6] = x[6] + y[6]
		o[7] = x[7] + y[7]
	}
	for ; i < n; i++ {
		out[i] = a[i] + b[i]
	}
}

func prod3[T Number](out, a, b []T) {
	n := len(out)
	a, b = a[:n], b[:n]
	i := 0
	for ; i+8 <= n; i += 8 {
		o, x, y := (*[8]T)(out[i:]), (*[8]T)(a[i:]), (*[8]T)(b[i:])
		o[0] = x[0] * y[0]
		o[1] = x[1] * y[1]
		o[2] = x[2] * y[2]
		o[3] = x[3] * y[3]
		o[4] = x[4] * y[4]
		o[5] = x[5] * y[5]
		o[6] = x[6] * y[6]
		o[7] = x[7] * y[7]
	}
	for ; i < n; i++ {
		out[i] = a[i] * b[i]
	}
}

// min3 and max3 use the built-in min and max, which are commutative for floats
// too: NaN wins, and -0 is below +0.
func min3[T Number](out, a, b []T) {
	n := len(out)
	a, b = a[:n], b[:n]
	i := 0
	for ; i+8 <= n; i += 8 {
		o, x, y := (*[8]T)(out[i:]), (*[8]T)(a[i:]), (*[8]T)(b[i:])
		o[0] = min(x[0], y[0])
		o[1] = min(x[1], y[1])
		o[2] = min(x[2], y[2])
		o[3] = min(x[3], y[3])
		o[4] = min(x[4], y[4])
		o[5] = min(x[5], y[5])
		o[6] = min(x[6], y[6])
		o[7] = min(x[7], y[7])
	}
	for ; i < n; i++ {
		out[i] = min(a[i], b[i])
	}
}

func max3[T Number](out, a, b []T) {
	n := len(out)
	a, b = a[:n], b[:n]
	i := 0
	for ; i+8 <= n; i += 8 {
		o, x, y := (*[8]T)(out[i:]), (*[8]T)(a[i:]), (*[8]T)(b[i:])
		o[0] = max(x[0], y[0])
		o[1] = max(x[1], y[1])
		o[2] = max(x[2], y[2])
		o[3] = max(x[3], y[3])
		o[4] = max(x[4], y[4])
		o[5] = max(x[5], y[5])
		o[6] = max(x[6], y[6])
		o[7] = max(x[7], y[7])
	}
	for ; i < n; i++ {
		out[i] = max(a[i], b[i])
	}
}
