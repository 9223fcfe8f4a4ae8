//go:build amd64 && !purego

package collective

import (
	"sync"
	"unsafe"
)

// hasAVX2 reports whether the CPU and the OS support AVX2. It asks the CPU on
// first use rather than at start-up (as golang.org/x/sys/cpu would): CPUID
// traps to the hypervisor in a virtual machine, and every rank program links
// this package, most of them never reducing anything.
var hasAVX2 = sync.OnceValue(func() bool {
	maxID, _, _, _ := cpuid(0, 0)
	if maxID < 7 {
		return false
	}
	_, _, ecx1, _ := cpuid(1, 0)
	const osxsave, avx = 1 << 27, 1 << 28
	if ecx1&osxsave == 0 || ecx1&avx == 0 {
		return false
	}
	if xcr0, _ := xgetbv(); xcr0&6 != 6 { // the OS saves XMM and YMM state
		return false
	}
	_, ebx7, _, _ := cpuid(7, 0)
	return ebx7&(1<<5) != 0
})

func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)

func xgetbv() (eax, edx uint32)

// AVX2 versions of the hot kernels (sum of every type, product of floats and
// int32): BenchmarkReduce shows them up to four times faster than the Go loops on
// data in cache, and the pipelined algorithms keep their chunks in cache. The
// other kernels stay in Go. Each comes in two forms: stores through the cache,
// and streaming stores (for frames another core reads; see stream.go), with a
// streaming copy beside them.

//go:noescape
func copyNTAVX2(out, a unsafe.Pointer, nbytes int)

//go:noescape
func addF32NTAVX2(out, a, b unsafe.Pointer, nbytes int)

//go:noescape
func addF64NTAVX2(out, a, b unsafe.Pointer, nbytes int)

//go:noescape
func mulF32NTAVX2(out, a, b unsafe.Pointer, nbytes int)

//go:noescape
func mulF64NTAVX2(out, a, b unsafe.Pointer, nbytes int)

//go:noescape
func addI32NTAVX2(out, a, b unsafe.Pointer, nbytes int)

//go:noescape
func addI64NTAVX2(out, a, b unsafe.Pointer, nbytes int)

//go:noescape
func mulI32NTAVX2(out, a, b unsafe.Pointer, nbytes int)

//go:noescape
func addF32AVX2(out, a, b unsafe.Pointer, nbytes int)

//go:noescape
func addF64AVX2(out, a, b unsafe.Pointer, nbytes int)

//go:noescape
func mulF32AVX2(out, a, b unsafe.Pointer, nbytes int)

//go:noescape
func mulF64AVX2(out, a, b unsafe.Pointer, nbytes int)

//go:noescape
func addI32AVX2(out, a, b unsafe.Pointer, nbytes int)

//go:noescape
func addI64AVX2(out, a, b unsafe.Pointer, nbytes int)

//go:noescape
func mulI32AVX2(out, a, b unsafe.Pointer, nbytes int)

type asmKernel func(out, a, b unsafe.Pointer, nbytes int)

// simdFuncs returns the cached and the streaming assembly kernels for d and op.
func simdFuncs(d DType, op Op) (cached, streaming asmKernel) {
	if !hasAVX2() {
		return nil, nil
	}
	switch {
	case d == Float32 && op == Sum:
		return addF32AVX2, addF32NTAVX2
	case d == Float64 && op == Sum:
		return addF64AVX2, addF64NTAVX2
	case d == Float32 && op == Prod:
		return mulF32AVX2, mulF32NTAVX2
	case d == Float64 && op == Prod:
		return mulF64AVX2, mulF64NTAVX2
	case d == Int32 && op == Sum:
		return addI32AVX2, addI32NTAVX2
	case d == Int64 && op == Sum:
		return addI64AVX2, addI64NTAVX2
	case d == Int32 && op == Prod:
		return mulI32AVX2, mulI32NTAVX2
	}
	return nil, nil
}

// simdKernel returns the assembly kernel for d and op, or nil.
func simdKernel(d DType, op Op) kernel {
	asm, _ := simdFuncs(d, op)
	if asm == nil {
		return nil
	}
	tail := kernelGo(d, op)
	return func(out, a, b []byte) {
		n := len(out) &^ 127
		if n > 0 {
			_, _ = a[n-1], b[n-1]
			asm(unsafe.Pointer(&out[0]), unsafe.Pointer(&a[0]), unsafe.Pointer(&b[0]), n)
		}
		if n < len(out) {
			tail(out[n:], a[n:len(out)], b[n:len(out)])
		}
	}
}

// makeStreamKernel makes the kernel for d and op whose stores bypass the
// cache, or nil.
func makeStreamKernel(d DType, op Op) kernel {
	_, asm := simdFuncs(d, op)
	if asm == nil {
		return nil
	}
	edge := simdKernel(d, op)
	return func(out, a, b []byte) {
		h := min(len(out), (32-int(uintptr(unsafe.Pointer(unsafe.SliceData(out)))&31))&31)
		if h > 0 {
			edge(out[:h], a[:h], b[:h])
		}
		n := (len(out) - h) &^ 127
		if n > 0 {
			_, _ = a[h+n-1], b[h+n-1]
			asm(unsafe.Pointer(&out[h]), unsafe.Pointer(&a[h]), unsafe.Pointer(&b[h]), n)
		}
		if r := h + n; r < len(out) {
			edge(out[r:], a[r:len(out)], b[r:len(out)])
		}
	}
}

// streamCopy copies src into dst (of equal length) with stores that bypass the
// cache, or returns false when this CPU has no such kernel.
func streamCopy(dst, src []byte) bool {
	if !hasAVX2() {
		return false
	}
	src = src[:len(dst)]
	h := min(len(dst), (32-int(uintptr(unsafe.Pointer(unsafe.SliceData(dst))))&31)&31)
	copy(dst[:h], src[:h])
	n := (len(dst) - h) &^ 127
	if n > 0 {
		copyNTAVX2(unsafe.Pointer(&dst[h]), unsafe.Pointer(&src[h]), n)
	}
	copy(dst[h+n:], src[h+n:])
	return true
}
