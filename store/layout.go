package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// The segment starts with a header page (or more):
//
//	0     magic "GEARSHRD"
//	8     version (u32)
//	12    length of the spec encoding (u32)
//	16    SHA-256 digest of the spec encoding (32 bytes)
//	48    total segment size (u64)
//	56    page size the offsets were computed with (u32)
//	60    state: 0 being set up, 1 ready, 2 closed by its owner (u32, atomic)
//	64    owner identity: pid<<32 | start time (u64)
//	128   free queue head (u64, atomic; each counter on its own cache line)
//	192   free queue tail
//	256   commit log tail (the next insertion sequence)
//	320   rows removed (released or evicted) since creation
//	384   FIFO eviction claim: commit-log position up to which writers have
//	      claimed the rows to evict (u64, atomic)
//	448   free bell: a futex word that a push on the free queue moves while a
//	      writer waits for a free row (u32), and at 452 its sleeping flag (u32)
//	1024  spec encoding
//
// followed, each page-aligned, by the writer slots (maxSlots u64 identities), the
// pin journals (pinSlots x pinEntries u64: the rows each handle holds Views of,
// so that the pins of a process that dies can be given back), the status table (capacity rows of 64 bytes), the free queue ring, the commit log ring
// and the column tables.
const (
	hdrMagic     = "GEARSHRD"
	hdrVersion   = 3
	offMagic     = 0
	offVersion   = 8
	offEncLen    = 12
	offDigest    = 16
	offTotal     = 48
	offPageSize  = 56
	offState     = 60
	offOwner     = 64
	offFreeHead  = 128
	offFreeTail  = 192
	offLogTail   = 256
	offRemovals  = 320
	offFIFOClaim = 384
	offFreeBell  = 448
	offEnc       = 1024
	maxEncLen    = 16 << 10
	encPlain     = 1 // the encoding of a spec without Packed (all there was before it)
	encVersion   = 2 // the newest: a packed spec's, encPlain's with a flags byte at the end
	statusStride = 64
	maxSlots     = 1024 // slot 0 means "no writer"
	pinSlots     = 64   // slots with a pin journal (handles in later slots have none)
	pinEntries   = 512  // journal entries per slot (a power of two): Views a handle can hold reclaimably
	minPageSize  = 4096
	maxPageSize  = 1 << 20

	stateSettingUp = 0
	stateReady     = 1
	stateClosed    = 2
)

// layout is a spec with every offset computed from it.
type layout struct {
	spec       Spec // normalized
	enc        []byte
	digest     [32]byte
	pageSize   int
	headerSize int
	slotsOff   int
	pinsOff    int
	statusOff  int
	freeOff    int
	freeCells  int // power of two
	logOff     int
	logCells   int // power of two
	cols       []colLayout
	total      int
}

type colLayout struct {
	frameBytes int
	blockBytes int
	stride     int
	tableOff   int
	tableLen   int
}

func nextPow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

// blockAlign is the alignment of a column's blocks of blockBytes: align, or
// when packed the block's size rounded up to a power of two, if that is less.
func blockAlign(align int, packed bool, blockBytes int) int {
	if !packed {
		return align
	}
	return min(align, nextPow2(blockBytes))
}

// computeLayout validates spec and lays the segment out for pageSize.
func computeLayout(spec Spec, pageSize int) (*layout, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if pageSize < minPageSize || pageSize > maxPageSize || pageSize&(pageSize-1) != 0 {
		return nil, fmt.Errorf("store: page size %d: want a power of two from %d to %d", pageSize, minPageSize, maxPageSize)
	}
	spec = spec.normalized()
	l := &layout{spec: spec, pageSize: pageSize}
	l.enc = encodeSpec(spec)
	l.digest = sha256.Sum256(l.enc)
	l.headerSize = roundUp(offEnc+len(l.enc), pageSize)
	off := l.headerSize
	l.slotsOff = off
	off += roundUp(maxSlots*8, pageSize)
	l.pinsOff = off
	off += roundUp(pinSlots*pinEntries*8, pageSize)
	l.statusOff = off
	off += roundUp(spec.Capacity*statusStride, pageSize)
	l.freeCells = nextPow2(2 * spec.Capacity)
	l.freeOff = off
	off += roundUp(l.freeCells*8, pageSize)
	l.logCells = nextPow2(max(2*spec.Capacity, 1024))
	l.logOff = off
	off += roundUp(l.logCells*8, pageSize)
	tableAlign := max(pageSize, spec.BlockAlign)
	for _, c := range spec.Columns {
		var cl colLayout
		cl.frameBytes = c.FrameBytes()
		cl.blockBytes = c.BlockBytes()
		cl.stride = roundUp(cl.blockBytes, blockAlign(spec.BlockAlign, spec.Packed, cl.blockBytes))
		off = roundUp(off, tableAlign)
		cl.tableOff = off
		cl.tableLen = roundUp(cl.stride*spec.Capacity, pageSize)
		off += cl.tableLen
		l.cols = append(l.cols, cl)
	}
	if off > maxTotalBytes {
		return nil, fmt.Errorf("store: shard of %d bytes: at most %d", off, uint64(maxTotalBytes))
	}
	l.total = off
	return l, nil
}

// encodeSpec writes a normalized spec in the binary form stored in segments and
// checkpoints (and hashed into the layout digest).
func encodeSpec(s Spec) []byte {
	// A spec without Packed keeps version 1, so that the segments and
	// checkpoints written before Packed existed still read as canonical, and a
	// build that predates it refuses a packed shard rather than misread it.
	v := byte(encPlain)
	if s.Packed {
		v = encVersion
	}
	b := []byte{v}
	b = binary.LittleEndian.AppendUint32(b, uint32(s.BlockAlign))
	b = binary.LittleEndian.AppendUint64(b, uint64(s.Capacity))
	b = append(b, byte(len(s.Remover)))
	b = append(b, s.Remover...)
	b = append(b, byte(len(s.Columns)))
	for _, c := range s.Columns {
		b = append(b, byte(len(c.Name)))
		b = append(b, c.Name...)
		b = append(b, byte(c.DType), byte(len(c.Shape)))
		for _, d := range c.Shape {
			b = binary.LittleEndian.AppendUint32(b, uint32(d))
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(c.Length))
	}
	if s.Packed {
		b = append(b, flagPacked)
	}
	return b
}

// flagPacked is the flags byte that ends a version 2 encoding: Packed.
const flagPacked = 1

var errShortSpec = errors.New("store: spec encoding is truncated")

type specReader struct {
	b   []byte
	err error
}

func (r *specReader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n > len(r.b) {
		r.err = errShortSpec
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *specReader) u8() int {
	v := r.take(1)
	if v == nil {
		return 0
	}
	return int(v[0])
}

func (r *specReader) u32() int {
	v := r.take(4)
	if v == nil {
		return 0
	}
	return int(binary.LittleEndian.Uint32(v))
}

func (r *specReader) u64() uint64 {
	v := r.take(8)
	if v == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(v)
}

// decodeSpec reads a spec encoding strictly (every byte accounted for) and validates it.
func decodeSpec(b []byte) (Spec, error) {
	r := &specReader{b: b}
	v := r.u8()
	if r.err == nil && (v < encPlain || v > encVersion) {
		return Spec{}, fmt.Errorf("store: spec encoding version %d, want %d to %d", v, encPlain, encVersion)
	}
	var s Spec
	s.BlockAlign = r.u32()
	c := r.u64()
	if c > MaxCapacity {
		return Spec{}, fmt.Errorf("store: capacity %d: at most %d rows", c, MaxCapacity)
	}
	s.Capacity = int(c)
	s.Remover = string(r.take(r.u8()))
	n := r.u8()
	for i := 0; i < n && r.err == nil; i++ {
		var col Column
		col.Name = string(r.take(r.u8()))
		col.DType = DType(r.u8())
		nd := r.u8()
		if nd > MaxDims {
			return Spec{}, fmt.Errorf("store: column %q: %d dimensions, at most %d", col.Name, nd, MaxDims)
		}
		if nd > 0 {
			col.Shape = make([]int, nd)
		}
		for j := range col.Shape {
			col.Shape[j] = r.u32()
		}
		col.Length = r.u32()
		s.Columns = append(s.Columns, col)
	}
	if v == encVersion && r.err == nil {
		if f := r.u8(); r.err == nil && f != flagPacked {
			return Spec{}, fmt.Errorf("store: spec encoding flags %#x, want %#x", f, flagPacked)
		}
		s.Packed = true
	}
	if r.err != nil {
		return Spec{}, r.err
	}
	if len(r.b) != 0 {
		return Spec{}, fmt.Errorf("store: spec encoding has %d bytes after its last column", len(r.b))
	}
	if err := s.Validate(); err != nil {
		return Spec{}, err
	}
	if s.Remover == "" {
		return Spec{}, fmt.Errorf("store: spec encoding names no remover")
	}
	return s, nil
}

// encodeHeader writes the fixed header and the spec encoding for l into b (the
// start of a fresh segment); the state stays "being set up".
func encodeHeader(b []byte, l *layout, owner uint64) {
	copy(b[offMagic:], hdrMagic)
	binary.LittleEndian.PutUint32(b[offVersion:], hdrVersion)
	binary.LittleEndian.PutUint32(b[offEncLen:], uint32(len(l.enc)))
	copy(b[offDigest:], l.digest[:])
	binary.LittleEndian.PutUint64(b[offTotal:], uint64(l.total))
	binary.LittleEndian.PutUint32(b[offPageSize:], uint32(l.pageSize))
	binary.LittleEndian.PutUint64(b[offOwner:], owner)
	copy(b[offEnc:], l.enc)
}

// errNotReady means the segment's header is not (yet) written.
var errNotReady = errors.New("store: shard is being set up")

// parseHeader reads a segment's header from b (at least the header pages; size is
// the segment's size) and returns its layout. It trusts nothing in b: every field
// is checked, the digest recomputed, and the offsets recomputed from the spec.
func parseHeader(b []byte, size int64) (*layout, error) {
	if len(b) < offEnc {
		return nil, fmt.Errorf("store: header of %d bytes, want at least %d", len(b), offEnc)
	}
	if string(b[offMagic:offMagic+8]) != hdrMagic {
		if allZero(b[offMagic : offMagic+8]) {
			return nil, errNotReady
		}
		return nil, fmt.Errorf("store: not a gear shard (magic %q)", b[offMagic:offMagic+8])
	}
	if v := binary.LittleEndian.Uint32(b[offVersion:]); v != hdrVersion {
		return nil, fmt.Errorf("store: shard version %d, want %d", v, hdrVersion)
	}
	n := int(binary.LittleEndian.Uint32(b[offEncLen:]))
	if n > maxEncLen || offEnc+n > len(b) {
		return nil, fmt.Errorf("store: spec encoding of %d bytes does not fit the header", n)
	}
	enc := b[offEnc : offEnc+n]
	if sha256.Sum256(enc) != [32]byte(b[offDigest:offDigest+32]) {
		return nil, fmt.Errorf("store: layout digest does not match the header's spec")
	}
	spec, err := decodeSpec(enc)
	if err != nil {
		return nil, err
	}
	ps := int(binary.LittleEndian.Uint32(b[offPageSize:]))
	l, err := computeLayout(spec, ps)
	if err != nil {
		return nil, err
	}
	// A shard's header holds its spec as computeLayout encodes it, defaults
	// filled in; any other encoding of the same spec (a block alignment of 0
	// for the default, say) was not written by a gear shard.
	if !bytes.Equal(l.enc, enc) {
		return nil, fmt.Errorf("store: the header's spec encoding is not the canonical one of its spec %+v", spec)
	}
	if t := binary.LittleEndian.Uint64(b[offTotal:]); t != uint64(l.total) {
		return nil, fmt.Errorf("store: header says %d bytes, layout needs %d", t, l.total)
	}
	if size < int64(l.total) {
		return nil, fmt.Errorf("store: segment has %d bytes, layout needs %d", size, l.total)
	}
	return l, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
