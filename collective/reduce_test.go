package collective

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// naive reductions, one element at a time, as the reference for the kernels.
func naiveOp[T Number](op Op, x, y T) T {
	switch op {
	case Sum:
		return x + y
	case Prod:
		return x * y
	case Min:
		if isNaN(x) || isNaN(y) {
			return nanOf[T]()
		}
		if x == y && x == 0 {
			if signbit(x) {
				return x
			}
			return y
		}
		if y < x {
			return y
		}
		return x
	case Max:
		if isNaN(x) || isNaN(y) {
			return nanOf[T]()
		}
		if x == y && x == 0 {
			if signbit(x) {
				return y
			}
			return x
		}
		if y > x {
			return y
		}
		return x
	}
	panic("bad op")
}

func isNaN[T Number](x T) bool { return x != x }
func signbit[T Number](x T) bool {
	switch v := any(x).(type) {
	case float32:
		return math.Signbit(float64(v))
	case float64:
		return math.Signbit(v)
	}
	return x < 0
}
func nanOf[T Number]() T {
	var z T
	switch any(z).(type) {
	case float32:
		return any(float32(math.NaN())).(T)
	case float64:
		return any(math.NaN()).(T)
	}
	panic("no NaN for integers")
}

func sameBits[T Number](x, y T) bool {
	if isNaN(x) && isNaN(y) {
		return true
	}
	switch a := any(x).(type) {
	case float32:
		return math.Float32bits(a) == math.Float32bits(any(y).(float32))
	case float64:
		return math.Float64bits(a) == math.Float64bits(any(y).(float64))
	}
	return x == y
}

func randomVals[T Number](r *rand.Rand, n int, specials bool) []T {
	out := make([]T, n)
	for i := range out {
		var v T
		switch p := any(&v).(type) {
		case *float32:
			*p = float32(r.NormFloat64() * 100)
		case *float64:
			*p = r.NormFloat64() * 100
		case *int32:
			*p = int32(r.Uint32())
		case *int64:
			*p = int64(r.Uint64())
		}
		out[i] = v
	}
	if specials {
		var z T
		if _, ok := any(z).(float32); ok || func() bool { _, ok := any(z).(float64); return ok }() {
			for i := 0; i < n; i += 7 {
				switch r.IntN(4) {
				case 0:
					out[i] = nanOf[T]()
				case 1:
					out[i] = 0
				case 2:
					out[i] = -out[i] * 0 // -0 or +0
					out[i] = T(math.Copysign(0, -1))
				case 3:
					out[i] = T(math.Inf(1))
				}
			}
		}
	}
	return out
}

func checkKernel[T Number](t *testing.T, d DType) {
	r := rand.New(rand.NewPCG(1, uint64(d)))
	for _, op := range []Op{Sum, Prod, Min, Max} {
		k := kernelFor(d, op)
		for _, n := range []int{0, 1, 7, 8, 9, 63, 1000} {
			a := randomVals[T](r, n, true)
			b := randomVals[T](r, n, true)
			want := make([]T, n)
			for i := range want {
				want[i] = naiveOp(op, a[i], b[i])
			}
			out := make([]T, n)
			k(asBytes(out), asBytes(a), asBytes(b))
			// commutative, bit for bit
			out2 := make([]T, n)
			k(asBytes(out2), asBytes(b), asBytes(a))
			// in place
			inPlace := append([]T(nil), a...)
			k(asBytes(inPlace), asBytes(inPlace), asBytes(b))
			for i := range want {
				if !sameBits(out[i], want[i]) || !sameBits(out2[i], want[i]) || !sameBits(inPlace[i], want[i]) {
					t.Fatalf("%v %v n=%d [%d]: %v op %v = %v / %v / %v, want %v", d, op, n, i, a[i], b[i], out[i], out2[i], inPlace[i], want[i])
				}
			}
		}
	}
}

// TestSimdKernels: the assembly kernels give the Go kernels' bits, at every
// length around their 128-byte blocks, in place too.
func TestSimdKernels(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, d := range []DType{Float32, Float64, Int32, Int64} {
		for _, op := range []Op{Sum, Prod, Min, Max} {
			k := simdKernel(d, op)
			if k == nil {
				continue
			}
			g := kernelGo(d, op)
			for n := 0; n < 700; n += 1 + n/8 {
				nb := n * d.Size()
				a, b := make([]byte, nb), make([]byte, nb)
				for i := range a {
					a[i], b[i] = byte(r.Uint32()), byte(r.Uint32())
				}
				want, got := make([]byte, nb), make([]byte, nb)
				g(want, a, b)
				k(got, a, b)
				if string(got) != string(want) {
					t.Fatalf("%v %v n=%d: assembly and Go differ", d, op, n)
				}
				k(a, a, b)
				if string(a) != string(want) {
					t.Fatalf("%v %v n=%d: in place, assembly and Go differ", d, op, n)
				}
			}
		}
	}
}

// TestStreamKernels: the kernels with streaming stores give the Go kernels' bits
// at every alignment of the destination and every length around the blocks.
func TestStreamKernels(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const max = 1200
	a, b := make([]byte, max+64), make([]byte, max+64)
	for i := range a {
		a[i], b[i] = byte(r.Uint32()), byte(r.Uint32())
	}
	for _, d := range []DType{Float32, Float64, Int32, Int64} {
		for _, op := range []Op{Sum, Prod} {
			k := streamKernel(d, op)
			if k == nil {
				continue
			}
			g := kernelGo(d, op)
			es := d.Size()
			for off := 0; off < 64; off += es {
				for n := 0; n*es+off <= max; n += 1 + n/5 {
					x, y := a[off:off+n*es], b[off:off+n*es]
					want := make([]byte, n*es)
					g(want, x, y)
					got := make([]byte, n*es+64)[off : off+n*es]
					k(got, x, y)
					if string(got) != string(want) {
						t.Fatalf("%v %v offset %d n=%d: streaming and Go differ", d, op, off, n)
					}
				}
			}
		}
	}
	for off := range 64 {
		for n := 0; n+off <= max; n += 1 + n/5 {
			dst := make([]byte, n+64)[off : off+n]
			ok := streamCopy(dst, a[:n])
			if ok && string(dst) != string(a[:n]) {
				t.Fatalf("streamCopy offset %d n=%d differs", off, n)
			}
		}
	}
}

// TestKernelsAreMadeOnce: picking a call's kernels allocates nothing (they
// were closures made on every call: four allocations per small AllReduce).
func TestKernelsAreMadeOnce(t *testing.T) {
	for _, d := range []DType{Int32, Int64, Float32, Float64} {
		for _, op := range []Op{Sum, Prod, Min, Max} {
			if kernelFor(d, op) == nil {
				t.Fatalf("no kernel for %v %v", d, op)
			}
			if n := testing.AllocsPerRun(100, func() { _, _ = kernelFor(d, op), streamKernel(d, op) }); n != 0 {
				t.Errorf("%v %v: picking the kernels made %v allocations", d, op, n)
			}
		}
	}
}

func TestKernels(t *testing.T) {
	checkKernel[float32](t, Float32)
	checkKernel[float64](t, Float64)
	checkKernel[int32](t, Int32)
	checkKernel[int64](t, Int64)
	if kernelFor(Bytes, Sum) != nil || kernelFor(Float32, 0) != nil {
		t.Fatal("kernelFor gave a kernel for bytes or for no op")
	}
}

// BenchmarkReduce compares the kernels with copy over the same bytes: a piece that
// stays in cache (64 KiB) and a buffer that does not (16 MiB). SetBytes counts the
// output bytes, so the figures are comparable with copy's.
func BenchmarkReduce(b *testing.B) {
	for _, size := range []int{64 << 10, 16 << 20} {
		x := make([]byte, size)
		y := make([]byte, size)
		out := make([]byte, size)
		b.Run(fmt.Sprintf("copy/bytes=%d", size), func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				copy(out, x)
			}
		})
		for _, c := range []struct {
			d  DType
			op Op
		}{{Float32, Sum}, {Float64, Sum}, {Int32, Sum}, {Int64, Sum}, {Float32, Max}, {Float32, Prod}} {
			for _, impl := range []struct {
				name string
				k    kernel
			}{{"go", kernelGo(c.d, c.op)}, {"simd", simdKernel(c.d, c.op)}} {
				if impl.k == nil {
					continue
				}
				b.Run(fmt.Sprintf("%v-%v-%s/bytes=%d", c.d, c.op, impl.name, size), func(b *testing.B) {
					b.SetBytes(int64(size))
					for b.Loop() {
						impl.k(out, x, y)
					}
				})
			}
		}
	}
}
