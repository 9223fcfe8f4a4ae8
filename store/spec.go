package store

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// DType is a column's element type.
type DType uint8

// The element types a column may hold. A column is raw memory of fixed-size
// elements in the host's byte order; the type says how to read an element and
// its size. The values are stored in segments and checkpoints: new types are
// added at the end, and none is renumbered.
const (
	Float32 DType = iota + 1
	Float64
	Float16
	BFloat16
	Int32
	Int64
	Uint8
	Bool
	Int8
	Int16
	Uint16
	Uint32
	Uint64

	lastDType = Uint64
)

// dtypeNames spells every element type: the one list that ParseDType,
// DTypeNames and String read.
var dtypeNames = [...]string{
	Float32:  "float32",
	Float64:  "float64",
	Float16:  "float16",
	BFloat16: "bfloat16",
	Int32:    "int32",
	Int64:    "int64",
	Uint8:    "uint8",
	Bool:     "bool",
	Int8:     "int8",
	Int16:    "int16",
	Uint16:   "uint16",
	Uint32:   "uint32",
	Uint64:   "uint64",
}

var dtypeSizes = [...]int{
	Float32:  4,
	Float64:  8,
	Float16:  2,
	BFloat16: 2,
	Int32:    4,
	Int64:    8,
	Uint8:    1,
	Bool:     1,
	Int8:     1,
	Int16:    2,
	Uint16:   2,
	Uint32:   4,
	Uint64:   8,
}

// Valid reports whether d is one of the defined element types.
func (d DType) Valid() bool { return d >= Float32 && d <= lastDType }

// DTypeNames returns the name of every element type, in the order of their
// values: exactly the names ParseDType accepts. The slice is the caller's.
func DTypeNames() []string {
	names := make([]string, 0, int(lastDType))
	for d := Float32; d <= lastDType; d++ {
		names = append(names, dtypeNames[d])
	}
	return names
}

// Size is the size of one element in bytes (0 for an invalid type).
func (d DType) Size() int {
	if !d.Valid() {
		return 0
	}
	return dtypeSizes[d]
}

// String returns the type's name, such as "float32".
func (d DType) String() string {
	if !d.Valid() {
		return "dtype(" + strconv.Itoa(int(d)) + ")"
	}
	return dtypeNames[d]
}

// ParseDType reads a type name such as "float32" or "bfloat16": one of
// DTypeNames.
func ParseDType(s string) (DType, error) {
	for d := Float32; d <= lastDType; d++ {
		if dtypeNames[d] == s {
			return d, nil
		}
	}
	return 0, fmt.Errorf("store: unknown element type %q: want one of %s", s, strings.Join(DTypeNames(), ", "))
}

// MarshalText writes the type's name, so that specs read and write it in TOML and JSON.
func (d DType) MarshalText() ([]byte, error) {
	if !d.Valid() {
		return nil, fmt.Errorf("store: invalid element type %d", uint8(d))
	}
	return []byte(d.String()), nil
}

// UnmarshalText reads a type name.
func (d *DType) UnmarshalText(b []byte) error {
	v, err := ParseDType(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// Column describes one field of a trajectory: its element type, the shape of one
// frame (empty for a scalar) and the number of frames per trajectory.
type Column struct {
	Name   string `toml:"name" json:"name"`
	DType  DType  `toml:"dtype" json:"dtype"`
	Shape  []int  `toml:"shape" json:"shape"`
	Length int    `toml:"length" json:"length"`
}

// FrameElems is the number of elements in one frame.
func (c Column) FrameElems() int {
	n := 1
	for _, d := range c.Shape {
		n *= d
	}
	return n
}

// FrameBytes is the size of one frame in bytes.
func (c Column) FrameBytes() int { return c.FrameElems() * c.DType.Size() }

// BlockBytes is the size of one block (Length frames) in bytes.
func (c Column) BlockBytes() int { return c.FrameBytes() * c.Length }

// Describe formats the column's frame shape and type as in error messages:
// "84x84x4 float32 (length 16)".
func (c Column) Describe() string {
	return fmt.Sprintf("%s %s (length %d)", FormatShape(c.Shape), c.DType, c.Length)
}

// FormatShape formats a frame shape as "84x84x4", or "scalar" for an empty one.
func FormatShape(shape []int) string {
	if len(shape) == 0 {
		return "scalar"
	}
	var b strings.Builder
	for i, d := range shape {
		if i > 0 {
			b.WriteByte('x')
		}
		b.WriteString(strconv.Itoa(d))
	}
	return b.String()
}

// Names of the built-in removers, for Spec.Remover.
const (
	RemoverFIFO           = "fifo"
	RemoverLIFO           = "lifo"
	RemoverLowestPriority = "lowest_priority"
	RemoverNone           = "none"
)

// Spec is a shard's layout: its capacity (rows), its columns, the remover that picks
// a victim when the shard is full, and the block alignment.
type Spec struct {
	Capacity int      `toml:"capacity" json:"capacity"`
	Columns  []Column `toml:"columns" json:"columns"`
	// Remover names the eviction policy: "fifo" (the default when empty), "lifo",
	// "lowest_priority", "none" (Allocate waits for a Release instead), or the Name
	// of a custom Remover given with WithRemover.
	Remover string `toml:"remover" json:"remover"`
	// BlockAlign is the alignment of every block in bytes: a power of two from 64
	// (the default when 0) to 65536.
	BlockAlign int `toml:"block_align" json:"block_align"`
	// Packed packs the blocks smaller than BlockAlign: each aligns to its size
	// rounded up to a power of two instead (a float32 column takes 4 bytes a
	// row, a 12-byte one 16), so that none straddles more cache lines than it
	// must. A sample's reads of such columns then touch a 16th of the pages and
	// cache lines; those blocks are no longer aligned for DMA, which the device
	// gather does not need (it reads at the widths that the strides allow).
	Packed bool `toml:"packed" json:"packed"`
}

// Limits on a Spec.
const (
	MaxCapacity   = 1 << 30
	MaxColumns    = 64
	MaxNameLen    = 64
	MaxDims       = 8
	MaxBlockBytes = 1 << 40
	maxTotalBytes = 1 << 46
	maxAlign      = 1 << 16
	minAlign      = 64
)

// normalized returns a copy of s with defaults filled in and slices copied.
func (s Spec) normalized() Spec {
	out := s
	if out.Remover == "" {
		out.Remover = RemoverFIFO
	}
	if out.BlockAlign == 0 {
		out.BlockAlign = minAlign
	}
	out.Columns = make([]Column, len(s.Columns))
	for i, c := range s.Columns {
		c.Shape = append([]int(nil), c.Shape...)
		out.Columns[i] = c
	}
	return out
}

// Validate checks the spec: a capacity and at least one column, unique non-empty
// names, valid element types, positive dimensions and lengths, and sizes that do
// not overflow. Errors name the column.
func (s Spec) Validate() error {
	if s.Capacity < 1 {
		return fmt.Errorf("store: capacity %d: want at least 1", s.Capacity)
	}
	if s.Capacity > MaxCapacity {
		return fmt.Errorf("store: capacity %d: at most %d rows", s.Capacity, MaxCapacity)
	}
	if len(s.Columns) == 0 {
		return fmt.Errorf("store: no columns")
	}
	if len(s.Columns) > MaxColumns {
		return fmt.Errorf("store: %d columns: at most %d", len(s.Columns), MaxColumns)
	}
	align := s.BlockAlign
	if align == 0 {
		align = minAlign
	}
	if align < minAlign || align > maxAlign || align&(align-1) != 0 {
		return fmt.Errorf("store: block alignment %d: want a power of two from %d to %d", s.BlockAlign, minAlign, maxAlign)
	}
	if len(s.Remover) > MaxNameLen {
		return fmt.Errorf("store: remover name %.20q...: at most %d bytes", s.Remover, MaxNameLen)
	}
	seen := make(map[string]bool, len(s.Columns))
	var total uint64
	for i, c := range s.Columns {
		if c.Name == "" {
			return fmt.Errorf("store: column %d has no name", i)
		}
		if seen[c.Name] {
			return fmt.Errorf("store: column %q appears twice", c.Name)
		}
		seen[c.Name] = true
		n, err := c.blockBytes()
		if err != nil {
			return err
		}
		stride := roundUp64(n, uint64(blockAlign(align, s.Packed, int(min(n, maxAlign)))))
		table := mulSat(stride, uint64(s.Capacity))
		if table > maxTotalBytes {
			return fmt.Errorf("store: column %q: %d blocks of %s overflow (%s bytes, at most %d)", c.Name, s.Capacity, c.Describe(), satString(table), uint64(maxTotalBytes))
		}
		total += table
		if total > maxTotalBytes {
			return fmt.Errorf("store: column %q: the shard's column tables overflow (%d bytes, at most %d)", c.Name, total, uint64(maxTotalBytes))
		}
	}
	return nil
}

// Validate checks one column on its own, as Spec.Validate does for each: a name
// of at most MaxNameLen bytes, a valid element type, at most MaxDims positive
// dimensions, a length of at least 1 and a block of at most MaxBlockBytes.
// Errors name the column.
func (c Column) Validate() error {
	if c.Name == "" {
		return fmt.Errorf("store: column has no name")
	}
	_, err := c.blockBytes()
	return err
}

// blockBytes checks c (all but an empty name) and returns its block's size.
func (c Column) blockBytes() (uint64, error) {
	if len(c.Name) > MaxNameLen {
		return 0, fmt.Errorf("store: column %.20q...: name longer than %d bytes", c.Name, MaxNameLen)
	}
	if !c.DType.Valid() {
		return 0, fmt.Errorf("store: column %q: invalid element type %d", c.Name, uint8(c.DType))
	}
	if len(c.Shape) > MaxDims {
		return 0, fmt.Errorf("store: column %q: shape %s has %d dimensions, at most %d", c.Name, FormatShape(c.Shape), len(c.Shape), MaxDims)
	}
	if c.Length < 1 {
		return 0, fmt.Errorf("store: column %q: length %d: want at least 1 frame", c.Name, c.Length)
	}
	n := uint64(c.DType.Size())
	for _, d := range c.Shape {
		if d < 1 {
			return 0, fmt.Errorf("store: column %q: shape %s: dimensions must be positive", c.Name, FormatShape(c.Shape))
		}
		n = mulSat(n, uint64(d))
	}
	n = mulSat(n, uint64(c.Length))
	if n > MaxBlockBytes {
		return 0, fmt.Errorf("store: column %q: a block of %s overflows (%s bytes, at most %d)", c.Name, c.Describe(), satString(n), uint64(MaxBlockBytes))
	}
	return n, nil
}

// mulSat multiplies, saturating at MaxUint64.
func mulSat(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi != 0 {
		return math.MaxUint64
	}
	return lo
}

func satString(n uint64) string {
	if n == math.MaxUint64 {
		return "more than 2^64"
	}
	return strconv.FormatUint(n, 10)
}

func roundUp64(n, a uint64) uint64 { return (n + a - 1) &^ (a - 1) }

func roundUp(n, a int) int { return (n + a - 1) &^ (a - 1) }

// diffSpec returns nil if a and b (normalized) are the same layout, and otherwise an
// error naming the first difference, with what the shard has (a) and what the caller
// asked for (b).
func diffSpec(a, b Spec) error { return diffSpecOf("shard", a, b) }

// diffSpecOf is diffSpec with another name for a's holder ("checkpoint").
func diffSpecOf(holder string, a, b Spec) error {
	if a.Capacity != b.Capacity {
		return fmt.Errorf("capacity: %s has %d rows, spec has %d", holder, a.Capacity, b.Capacity)
	}
	if a.BlockAlign != b.BlockAlign {
		return fmt.Errorf("block alignment: %s has %d, spec has %d", holder, a.BlockAlign, b.BlockAlign)
	}
	if a.Packed != b.Packed {
		return fmt.Errorf("packed blocks: %s has %t, spec has %t", holder, a.Packed, b.Packed)
	}
	if a.Remover != b.Remover {
		return fmt.Errorf("remover: %s has %q, spec has %q", holder, a.Remover, b.Remover)
	}
	for i := 0; i < len(a.Columns) || i < len(b.Columns); i++ {
		switch {
		case i >= len(a.Columns):
			return fmt.Errorf("column %q: %s has no such column, spec has %s", b.Columns[i].Name, holder, b.Columns[i].Describe())
		case i >= len(b.Columns):
			return fmt.Errorf("column %q: %s has %s, spec has no such column", a.Columns[i].Name, holder, a.Columns[i].Describe())
		}
		ca, cb := a.Columns[i], b.Columns[i]
		if ca.Name != cb.Name {
			return fmt.Errorf("column %d: %s has %q (%s), spec has %q (%s)", i, holder, ca.Name, ca.Describe(), cb.Name, cb.Describe())
		}
		if ca.DType != cb.DType || ca.Length != cb.Length || !equalInts(ca.Shape, cb.Shape) {
			return fmt.Errorf("column %q: %s has %s, spec has %s", ca.Name, holder, ca.Describe(), cb.Describe())
		}
	}
	return nil
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
