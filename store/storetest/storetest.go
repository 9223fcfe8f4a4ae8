// Package storetest has helpers for tests of code that uses store shards: segment
// names that follow gear's convention, shards closed (and removed) at the end of a
// test, a check that no segment is left in /dev/shm, and deterministic payloads
// that a reader can check.
package storetest

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/store"
)

var seq atomic.Uint64

// Name returns a fresh segment name for this process's job:
// rank.SegmentName(rank.LocalJobID(), "store.<what>.<n>").
func Name(t testing.TB, what string) string {
	t.Helper()
	w := strings.Map(func(r rune) rune {
		if r == '/' || r == 0 || r == ' ' {
			return '-'
		}
		return r
	}, what)
	if len(w) > 100 {
		w = w[:100]
	}
	return rank.SegmentName(rank.LocalJobID(), fmt.Sprintf("store.%s.%d", w, seq.Add(1)))
}

// Create makes a shard named after the test and closes it (removing its segment)
// when the test ends.
func Create(t testing.TB, spec store.Spec, opts ...store.Option) *store.Shard {
	t.Helper()
	s, err := store.Create(Name(t, t.Name()), spec, opts...)
	if err != nil {
		t.Fatalf("store.Create: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close shard: %v", err)
		}
	})
	return s
}

// Spec is a small three-column layout for tests: "obs" float32 8x8 and "act" int32
// 2, both of length 4, and "meta" int64 4 of length 1 (room for a payload's
// identity and checksum, see Fill).
func Spec(capacity int) store.Spec {
	return store.Spec{
		Capacity: capacity,
		Columns: []store.Column{
			{Name: "obs", DType: store.Float32, Shape: []int{8, 8}, Length: 4},
			{Name: "act", DType: store.Int32, Shape: []int{2}, Length: 4},
			{Name: "meta", DType: store.Int64, Shape: []int{4}, Length: 1},
		},
	}
}

// Leftovers lists the segments in /dev/shm of the given jobs (this process's job,
// rank.LocalJobID(), when none is given).
func Leftovers(jobIDs ...string) ([]string, error) {
	if len(jobIDs) == 0 {
		jobIDs = []string{rank.LocalJobID()}
	}
	ents, err := os.ReadDir("/dev/shm")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if job, ok := rank.SegmentJob(e.Name()); ok && slices.Contains(jobIDs, job) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// splitmix64 is a tiny deterministic generator for payloads.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// metaMagic marks a "meta" block written by Fill.
const metaMagic = 0x6765617273746f72

// Fill writes the payload identified by id into every column of row p, a layout
// made by Spec: the blocks of every column but the last are filled from id with a
// deterministic generator, and the last column's block (int64, at least 3
// elements) holds id, a checksum of the other blocks and a magic number.
func Fill(p store.Pending, id uint64) {
	s := p.Shard()
	n := len(s.Spec().Columns)
	var sum uint64
	for c := 0; c < n-1; c++ {
		b := p.Block(c)
		sum = fillBytes(b, id, uint64(c), sum)
	}
	meta := p.Block(n - 1)
	binary.LittleEndian.PutUint64(meta[0:], id)
	binary.LittleEndian.PutUint64(meta[8:], sum)
	binary.LittleEndian.PutUint64(meta[16:], metaMagic)
}

func fillBytes(b []byte, id, col, sum uint64) uint64 {
	x := splitmix64(id*1315423911 + col)
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x = splitmix64(x)
		binary.LittleEndian.PutUint64(b[i:], x)
		sum = splitmix64(sum ^ x)
	}
	for ; i < len(b); i++ {
		x = splitmix64(x)
		b[i] = byte(x)
		sum = splitmix64(sum ^ uint64(b[i]))
	}
	return sum
}

// Check verifies a row written by Fill (through any Row: a View, a Pending, or
// blocks copied out with CopyBlock passed as blocks) and returns its id. Every byte
// is compared with what Fill would write for that id.
func Check(blocks [][]byte) (uint64, error) {
	n := len(blocks)
	if n < 2 {
		return 0, fmt.Errorf("storetest: %d columns, want at least 2", n)
	}
	meta := blocks[n-1]
	if len(meta) < 24 {
		return 0, fmt.Errorf("storetest: last column has %d bytes, want at least 24", len(meta))
	}
	id := binary.LittleEndian.Uint64(meta[0:])
	if m := binary.LittleEndian.Uint64(meta[16:]); m != metaMagic {
		return id, fmt.Errorf("storetest: row %d: meta magic %#x, want %#x (half-written row?)", id, m, uint64(metaMagic))
	}
	var sum uint64
	for c := 0; c < n-1; c++ {
		want := make([]byte, len(blocks[c]))
		sum = fillBytes(want, id, uint64(c), sum)
		if i := firstDiff(want, blocks[c]); i >= 0 {
			return id, fmt.Errorf("storetest: payload %d: column %d differs at byte %d (half-written or overwritten row)", id, c, i)
		}
	}
	if got := binary.LittleEndian.Uint64(meta[8:]); got != sum {
		return id, fmt.Errorf("storetest: payload %d: checksum %#x, want %#x", id, got, sum)
	}
	return id, nil
}

// Blocks returns every column's block of r.
func Blocks(r store.Row) [][]byte {
	n := len(r.Shard().Spec().Columns)
	out := make([][]byte, n)
	for c := range n {
		out[c] = r.Block(c)
	}
	return out
}

func firstDiff(a, b []byte) int {
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// Dump returns a canonical byte image of a shard's committed rows: for each
// selectable row in index order, its status and every column's block. Two shards
// with equal dumps hold the same trajectories with the same statuses. It reads the
// blocks without pinning them: use it on a shard that nobody writes meanwhile.
func Dump(s *store.Shard) []byte {
	var out []byte
	n := len(s.Spec().Columns)
	for st := range s.Rows() {
		out = binary.LittleEndian.AppendUint64(out, uint64(st.Index))
		out = binary.LittleEndian.AppendUint64(out, st.Seq)
		out = binary.LittleEndian.AppendUint64(out, st.Key)
		out = binary.LittleEndian.AppendUint64(out, math.Float64bits(st.Priority))
		out = binary.LittleEndian.AppendUint64(out, uint64(st.TimesSampled))
		out = binary.LittleEndian.AppendUint64(out, uint64(st.InsertedAt))
		for c := range n {
			off := s.BlockOffset(c, st.Index)
			out = append(out, s.ColumnTable(c)[off:off+s.BlockBytes(c)]...)
		}
	}
	return out
}
