#include "textflag.h"

// func Write(p unsafe.Pointer)
TEXT ·Write(SB), NOSPLIT, $0-8
	MOVQ p+0(FP), AX
	// PREFETCHW (AX), which the assembler does not name. CPUs without it
	// (Intel's before Broadwell) take it for a no-op.
	BYTE $0x0F; BYTE $0x0D; BYTE $0x08
	RET
