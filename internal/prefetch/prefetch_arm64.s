#include "textflag.h"

// func Write(p unsafe.Pointer)
TEXT ·Write(SB), NOSPLIT, $0-8
	MOVD p+0(FP), R0
	PRFM (R0), PSTL1KEEP
	RET
