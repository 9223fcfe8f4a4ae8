//go:build !amd64 || purego

package collective

func simdKernel(DType, Op) kernel       { return nil }
func makeStreamKernel(DType, Op) kernel { return nil }
func streamCopy(dst, src []byte) bool   { return false }
