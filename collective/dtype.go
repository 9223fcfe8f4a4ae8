package collective

import (
	"fmt"
	"unsafe"
)

// DType names an element type on the wire.
type DType uint8

// Element types.
const (
	Bytes   DType = 1 // byte: Broadcast, AllGather, Gather, Scatter, AllToAll, Send, Recv
	Int32   DType = 2
	Int64   DType = 3
	Float32 DType = 4
	Float64 DType = 5
)

// String returns the Go name of the element type.
func (d DType) String() string {
	switch d {
	case Bytes:
		return "byte"
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	case 0:
		return "none"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Size is the element size in bytes.
func (d DType) Size() int {
	switch d {
	case Bytes:
		return 1
	case Int32, Float32:
		return 4
	case Int64, Float64:
		return 8
	}
	return 1
}

// Op is a reduction. Every Op is commutative and gives bitwise identical results
// on every rank of a collective.
type Op uint8

// Reductions. Integer Sum and Prod wrap around on overflow, as Go arithmetic does.
// Float Min and Max return NaN when any operand is NaN, and order -0 below +0.
const (
	Sum  Op = 1
	Prod Op = 2
	Min  Op = 3
	Max  Op = 4
)

// String returns the lower-case name of the reduction.
func (o Op) String() string {
	switch o {
	case Sum:
		return "sum"
	case Prod:
		return "prod"
	case Min:
		return "min"
	case Max:
		return "max"
	case 0:
		return "none"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

func (o Op) valid() bool { return o >= Sum && o <= Max }

// Number is an element type that reductions accept.
type Number interface {
	float32 | float64 | int32 | int64
}

// Elem is any element type a collective moves.
type Elem interface {
	Number | byte
}

// dtypeOf returns the wire type of T. The type switch is on a zero value, once per
// call: no reflection.
func dtypeOf[T Elem]() DType {
	var z T
	switch any(z).(type) {
	case byte:
		return Bytes
	case int32:
		return Int32
	case int64:
		return Int64
	case float32:
		return Float32
	case float64:
		return Float64
	}
	panic("collective: unreachable element type")
}

// asBytes views s as its bytes, without copying.
func asBytes[T Elem](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}
