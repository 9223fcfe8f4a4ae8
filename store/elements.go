package store

import (
	"fmt"
	"unsafe"
)

// Float16Bits is an IEEE 754 half-precision number as stored: its bits. It is the
// Go element type of a Float16 column.
type Float16Bits uint16

// BFloat16Bits is a bfloat16 number as stored: its bits. It is the Go element type
// of a BFloat16 column.
type BFloat16Bits uint16

// Element is a Go type that stands for a column element type.
type Element interface {
	float32 | float64 | Float16Bits | BFloat16Bits | int8 | int16 | int32 | int64 | uint8 | uint16 | uint32 | uint64 | bool
}

// DTypeOf returns the column element type that T stands for.
func DTypeOf[T Element]() DType {
	var z T
	switch any(z).(type) {
	case float32:
		return Float32
	case float64:
		return Float64
	case Float16Bits:
		return Float16
	case BFloat16Bits:
		return BFloat16
	case int32:
		return Int32
	case int64:
		return Int64
	case uint8:
		return Uint8
	case bool:
		return Bool
	case int8:
		return Int8
	case int16:
		return Int16
	case uint16:
		return Uint16
	case uint32:
		return Uint32
	case uint64:
		return Uint64
	}
	panic("unreachable")
}

// Row is a row whose blocks can be viewed: a Pending (to write) or a View (to read).
type Row interface {
	Block(col int) []byte
	Shard() *Shard
}

var _ Row = Pending{}
var _ Row = View{}

// Block returns column col's whole block of r (Length frames, flattened) as a []T,
// without copying. It fails, naming the column and both types, unless T stands for
// the column's element type. For a View the slice is read-only.
func Block[T Element, R Row](r R, col int) ([]T, error) {
	s := r.Shard()
	if err := s.checkType(col, DTypeOf[T]()); err != nil {
		return nil, err
	}
	return asSlice[T](r.Block(col)), nil
}

// Frame returns frame t of column col's block of r as a []T, without copying.
func Frame[T Element, R Row](r R, col, t int) ([]T, error) {
	s := r.Shard()
	if err := s.checkType(col, DTypeOf[T]()); err != nil {
		return nil, err
	}
	c := s.l.spec.Columns[col]
	if t < 0 || t >= c.Length {
		return nil, fmt.Errorf("store: column %q: frame %d out of range [0, %d)", c.Name, t, c.Length)
	}
	fb := s.l.cols[col].frameBytes
	return asSlice[T](r.Block(col)[t*fb : (t+1)*fb]), nil
}

// PutFrame copies data into frame t of column col of p. shape, if given, is the
// shape data stands for and must equal the column's frame shape; data must hold
// exactly one frame. Errors name the column and both shapes or types.
func PutFrame[T Element](p Pending, col, t int, data []T, shape ...int) error {
	dst, err := Frame[T](p, col, t)
	if err != nil {
		return err
	}
	c := p.s.l.spec.Columns[col]
	if shape != nil && !equalInts(shape, c.Shape) {
		return fmt.Errorf("store: column %q: want %s %s, got %s %s", c.Name, FormatShape(c.Shape), c.DType, FormatShape(shape), c.DType)
	}
	if len(data) != len(dst) {
		return fmt.Errorf("store: column %q: want %s %s (%d elements), got %d elements", c.Name, FormatShape(c.Shape), c.DType, len(dst), len(data))
	}
	copy(dst, data)
	return nil
}

// PutBlock copies data into column col's whole block of p; data must hold Length
// frames. shape, if given, must be the frame shape with Length in front.
func PutBlock[T Element](p Pending, col int, data []T, shape ...int) error {
	dst, err := Block[T](p, col)
	if err != nil {
		return err
	}
	c := p.s.l.spec.Columns[col]
	want := append([]int{c.Length}, c.Shape...)
	if shape != nil && !equalInts(shape, want) {
		return fmt.Errorf("store: column %q: want %s %s, got %s %s", c.Name, FormatShape(want), c.DType, FormatShape(shape), c.DType)
	}
	if len(data) != len(dst) {
		return fmt.Errorf("store: column %q: want %s %s (%d elements), got %d elements", c.Name, FormatShape(want), c.DType, len(dst), len(data))
	}
	copy(dst, data)
	return nil
}

func (s *Shard) checkType(col int, d DType) error {
	if col < 0 || col >= len(s.l.spec.Columns) {
		return fmt.Errorf("store: column %d out of range [0, %d) of %q", col, len(s.l.spec.Columns), s.name)
	}
	c := s.l.spec.Columns[col]
	if c.DType != d {
		return fmt.Errorf("store: column %q: want %s %s, got %s", c.Name, FormatShape(c.Shape), c.DType, d)
	}
	return nil
}

// asSlice views b as a []T. Blocks are aligned to at least 64 bytes, so every
// element type is aligned.
func asSlice[T Element](b []byte) []T {
	var z T
	size := int(unsafe.Sizeof(z))
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), len(b)/size)
}
