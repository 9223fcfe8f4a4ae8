//go:build amd64 && !purego

#include "textflag.h"

// AVX2 kernels: out[i] = a[i] OP b[i] over nbytes bytes, nbytes a multiple of 128
// (the Go side does the tail). Every element is computed as the scalar code
// computes it (one IEEE operation, no reassociation), so results are bit for bit
// those of reduce.go. out may be a or b.

// func addF32AVX2(out, a, b unsafe.Pointer, nbytes int)
TEXT ·addF32AVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ nbytes+24(FP), CX
	SHRQ $7, CX
	JZ   done
loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VADDPS 0(DX), Y0, Y0
	VADDPS 32(DX), Y1, Y1
	VADDPS 64(DX), Y2, Y2
	VADDPS 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER
done:
	RET

// func addF64AVX2(out, a, b unsafe.Pointer, nbytes int)
TEXT ·addF64AVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ nbytes+24(FP), CX
	SHRQ $7, CX
	JZ   done
loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VADDPD 0(DX), Y0, Y0
	VADDPD 32(DX), Y1, Y1
	VADDPD 64(DX), Y2, Y2
	VADDPD 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER
done:
	RET

// func mulF32AVX2(out, a, b unsafe.Pointer, nbytes int)
TEXT ·mulF32AVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ nbytes+24(FP), CX
	SHRQ $7, CX
	JZ   done
loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VMULPS 0(DX), Y0, Y0
	VMULPS 32(DX), Y1, Y1
	VMULPS 64(DX), Y2, Y2
	VMULPS 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER
done:
	RET

// func mulF64AVX2(out, a, b unsafe.Pointer, nbytes int)
TEXT ·mulF64AVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ nbytes+24(FP), CX
	SHRQ $7, CX
	JZ   done
loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VMULPD 0(DX), Y0, Y0
	VMULPD 32(DX), Y1, Y1
	VMULPD 64(DX), Y2, Y2
	VMULPD 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER
done:
	RET

// func addI32AVX2(out, a, b unsafe.Pointer, nbytes int)
TEXT ·addI32AVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ nbytes+24(FP), CX
	SHRQ $7, CX
	JZ   done
loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPADDD 0(DX), Y0, Y0
	VPADDD 32(DX), Y1, Y1
	VPADDD 64(DX), Y2, Y2
	VPADDD 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER
done:
	RET

// func addI64AVX2(out, a, b unsafe.Pointer, nbytes int)
TEXT ·addI64AVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ nbytes+24(FP), CX
	SHRQ $7, CX
	JZ   done
loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPADDQ 0(DX), Y0, Y0
	VPADDQ 32(DX), Y1, Y1
	VPADDQ 64(DX), Y2, Y2
	VPADDQ 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER
done:
	RET

// func mulI32AVX2(out, a, b unsafe.Pointer, nbytes int)
TEXT ·mulI32AVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ nbytes+24(FP), CX
	SHRQ $7, CX
	JZ   done
loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPMULLD 0(DX), Y0, Y0
	VPMULLD 32(DX), Y1, Y1
	VPMULLD 64(DX), Y2, Y2
	VPMULLD 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER
done:
	RET

// Streaming versions: the stores bypass the cache (VMOVNTDQ), for data that the
// writer will not read again soon: frames another core reads, results too large
// for the cache. out must be 32-byte aligned. They end with SFENCE, so that the
// stores are visible before the caller publishes them.

// func copyNTAVX2(out, a unsafe.Pointer, nbytes int)
TEXT ·copyNTAVX2(SB), NOSPLIT, $0-24
	MOVQ out+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ nbytes+16(FP), CX
	SHRQ $7, CX
	JZ   cdone
cloop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VMOVNTDQ Y0, 0(DI)
	VMOVNTDQ Y1, 32(DI)
	VMOVNTDQ Y2, 64(DI)
	VMOVNTDQ Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DI
	DECQ CX
	JNZ  cloop
	SFENCE
	VZEROUPPER
cdone:
	RET

// func addF32NTAVX2(out, a, b unsafe.Pointer, nbytes int)
TEXT ·addF32NTAVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ nbytes+24(FP), CX
	SHRQ $7, CX
	JZ   done
loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VADDPS 0(DX), Y0, Y0
	VADDPS 32(DX), Y1, Y1
	VADDPS 64(DX), Y2, Y2
	VADDPS 96(DX), Y3, Y3
	VMOVNTDQ Y0, 0(DI)
	VMOVNTDQ Y1, 32(DI)
	VMOVNTDQ Y2, 64(DI)
	VMOVNTDQ Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	SFENCE
	VZEROUPPER
done:
	RET

// func addF64NTAVX2(out, a, b unsafe.Pointer, nbytes int)
TEXT ·addF64NTAVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ nbytes+24(FP), CX
	SHRQ $7, CX
	JZ   done
loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VADDPD 0(DX), Y0, Y0
	VADDPD 32(DX), Y1, Y1
	VADDPD 64(DX), Y2, Y2
	VADDPD 96(DX), Y3, Y3
	VMOVNTDQ Y0, 0(DI)
	VMOVNTDQ Y1, 32(DI)
	VMOVNTDQ Y2, 64(DI)
	VMOVNTDQ Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	SFENCE
	VZEROUPPER
done:
	RET

// func mulF32NTAVX2(out, a, b unsafe.Pointer, nbytes int)
TEXT ·mulF32NTAVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ nbytes+24(FP), CX
	SHRQ $7, CX
	JZ   done
loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VMULPS 0(DX), Y0, Y0
	VMULPS 32(DX), Y1, Y1
	VMULPS 64(DX), Y2, Y2
	VMULPS 96(DX), Y3, Y3
	VMOVNTDQ Y0, 0(DI)
	VMOVNTDQ Y1, 32(DI)
	VMOVNTDQ Y2, 64(DI)
	VMOVNTDQ Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	SFENCE
	VZEROUPPER
done:
	RET

// func mulF64NTAVX2(out, a, b unsafe.Pointer, nbytes int)
TEXT ·mulF64NTAVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ nbytes+24(FP), CX
	SHRQ $7, CX
	JZ   done
loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VMULPD 0(DX), Y0, Y0
	VMULPD 32(DX), Y1, Y1
	VMULPD 64(DX), Y2, Y2
	VMULPD 96(DX), Y3, Y3
	VMOVNTDQ Y0, 0(DI)
	VMOVNTDQ Y1, 32(DI)
	VMOVNTDQ Y2, 64(DI)
	VMOVNTDQ Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	SFENCE
	VZEROUPPER
done:
	RET

// func addI32NTAVX2(out, a, b unsafe.Pointer, nbytes int)
TEXT ·addI32NTAVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ nbytes+24(FP), CX
	SHRQ $7, CX
	JZ   done
loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPADDD 0(DX), Y0, Y0
	VPADDD 32(DX), Y1, Y1
	VPADDD 64(DX), Y2, Y2
	VPADDD 96(DX), Y3, Y3
	VMOVNTDQ Y0, 0(DI)
	VMOVNTDQ Y1, 32(DI)
	VMOVNTDQ Y2, 64(DI)
	VMOVNTDQ Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	SFENCE
	VZEROUPPER
done:
	RET

// func addI64NTAVX2(out, a, b unsafe.Pointer, nbytes int)
TEXT ·addI64NTAVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ nbytes+24(FP), CX
	SHRQ $7, CX
	JZ   done
loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPADDQ 0(DX), Y0, Y0
	VPADDQ 32(DX), Y1, Y1
	VPADDQ 64(DX), Y2, Y2
	VPADDQ 96(DX), Y3, Y3
	VMOVNTDQ Y0, 0(DI)
	VMOVNTDQ Y1, 32(DI)
	VMOVNTDQ Y2, 64(DI)
	VMOVNTDQ Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	SFENCE
	VZEROUPPER
done:
	RET

// func mulI32NTAVX2(out, a, b unsafe.Pointer, nbytes int)
TEXT ·mulI32NTAVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ nbytes+24(FP), CX
	SHRQ $7, CX
	JZ   done
loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPMULLD 0(DX), Y0, Y0
	VPMULLD 32(DX), Y1, Y1
	VPMULLD 64(DX), Y2, Y2
	VPMULLD 96(DX), Y3, Y3
	VMOVNTDQ Y0, 0(DI)
	VMOVNTDQ Y1, 32(DI)
	VMOVNTDQ Y2, 64(DI)
	VMOVNTDQ Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	SFENCE
	VZEROUPPER
done:
	RET
