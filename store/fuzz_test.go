package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gear-rl/gear/rank"
)

var fuzzSeq atomic.Uint64

func seedSpecs() []Spec {
	return []Spec{
		{Capacity: 3, Columns: []Column{
			{Name: "obs", DType: Float32, Shape: []int{4, 4}, Length: 2},
			{Name: "r", DType: Float64, Length: 2},
		}},
		{Capacity: 1, Remover: RemoverLowestPriority, BlockAlign: 128, Columns: []Column{
			{Name: "x", DType: BFloat16, Shape: []int{3}, Length: 1},
			{Name: "done", DType: Bool, Length: 5},
			{Name: "a", DType: Int64, Shape: []int{1, 2, 3}, Length: 1},
		}},
		{Capacity: 5, Remover: RemoverLIFO, Packed: true, Columns: []Column{
			{Name: "r", DType: Float32, Length: 1},
			{Name: "pos", DType: Float32, Shape: []int{3}, Length: 1},
			{Name: "obs", DType: Uint8, Shape: []int{70}, Length: 1},
		}},
	}
}

func FuzzParseHeader(f *testing.F) {
	for _, spec := range seedSpecs() {
		l, err := computeLayout(spec, 4096)
		if err != nil {
			f.Fatal(err)
		}
		b := make([]byte, l.headerSize)
		encodeHeader(b, l, 42<<32|7)
		f.Add(b, false)
		f.Add(b[:offEnc+len(l.enc)], true)
	}
	f.Add([]byte(hdrMagic), false)
	f.Fuzz(func(t *testing.T, b []byte, fixDigest bool) {
		if fixDigest && len(b) >= offEnc {
			// Let the fuzzer past the digest, into the spec decoder.
			if n := int(binary.LittleEndian.Uint32(b[offEncLen:])); n <= len(b)-offEnc {
				d := sha256.Sum256(b[offEnc : offEnc+n])
				copy(b[offDigest:], d[:])
			}
		}
		l, err := parseHeader(b, 1<<50)
		if err != nil {
			return
		}
		// A header that parses is exactly the header of its layout.
		again := make([]byte, offEnc+len(l.enc))
		encodeHeader(again, l, binary.LittleEndian.Uint64(b[offOwner:]))
		for _, r := range [][2]int{{0, offState}, {offOwner, offOwner + 8}, {offEnc, offEnc + len(l.enc)}} {
			if !bytes.Equal(b[r[0]:r[1]], again[r[0]:r[1]]) {
				t.Fatalf("bytes %d..%d: parsed header re-encodes differently", r[0], r[1])
			}
		}
		if err := l.spec.Validate(); err != nil {
			t.Fatalf("parsed an invalid spec: %v", err)
		}
	})
}

// memImage decodes checkpoints of small layouts into memory.
func memImage(h ckptHeader) (*ckptImage, error) {
	l, err := computeLayout(h.spec, 4096)
	if err != nil {
		return nil, err
	}
	if l.total > 4<<20 {
		return nil, fmt.Errorf("layout of %d bytes is too big for this test", l.total)
	}
	img := &ckptImage{l: l, status: make([]byte, l.spec.Capacity*statusRecSize)}
	for _, c := range l.cols {
		img.tables = append(img.tables, make([]byte, c.tableLen))
	}
	return img, nil
}

// seedCheckpoint writes a small checkpoint of a real shard and returns its bytes.
func seedCheckpoint(f *testing.F, spec Spec, rows int) []byte {
	name := rank.SegmentName(rank.LocalJobID(), fmt.Sprintf("store.fuzzseed.%d", fuzzSeq.Add(1)))
	s, err := Create(name, spec)
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	for i := range rows {
		p, err := s.Allocate(context.Background())
		if err != nil {
			f.Fatal(err)
		}
		for c := range spec.Columns {
			b := p.Block(c)
			for j := range b {
				b[j] = byte(i*7 + j)
			}
		}
		if _, err := p.CommitKey(uint64(i), float64(i)); err != nil {
			f.Fatal(err)
		}
	}
	path := filepath.Join(f.TempDir(), "seed.ckpt")
	if err := s.Checkpoint(context.Background(), path, WithFrameSize(100)); err != nil {
		f.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

func FuzzCheckpointReader(f *testing.F) {
	specs := seedSpecs()
	f.Add(seedCheckpoint(f, specs[0], 2))
	f.Add(seedCheckpoint(f, specs[1], 1))
	f.Add([]byte(ckptMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, img, recs, err := readCheckpoint(context.Background(), bytes.NewReader(b), memImage, nil)
		if err != nil {
			return
		}
		// What was accepted is consistent.
		if len(recs) != h.spec.Capacity || len(img.tables) != len(h.spec.Columns) {
			t.Fatalf("%d records, %d tables for %+v", len(recs), len(img.tables), h.spec)
		}
		for _, r := range recs {
			if r.committed && r.st.Seq >= h.nextSeq {
				t.Fatalf("accepted seq %d >= %d", r.st.Seq, h.nextSeq)
			}
		}
	})
}

// A spec without Packed encodes as version 1, byte for byte what the builds
// before Packed wrote (their segments stay canonical); a packed one as
// version 2, ending with its flags byte. Unknown versions and flags are
// refused.
func TestSpecEncodingVersions(t *testing.T) {
	spec := Spec{Capacity: 8, Remover: RemoverFIFO, BlockAlign: 64, Columns: []Column{{Name: "r", DType: Float32, Length: 1}}}
	plain := encodeSpec(spec)
	if plain[0] != 1 {
		t.Fatalf("a spec without Packed encodes as version %d, want 1", plain[0])
	}
	spec.Packed = true
	packed := encodeSpec(spec)
	if packed[0] != 2 || len(packed) != len(plain)+1 || packed[len(packed)-1] != flagPacked {
		t.Fatalf("a packed spec: version %d, %d bytes (plain %d), last byte %d", packed[0], len(packed), len(plain), packed[len(packed)-1])
	}
	for _, c := range []struct {
		enc    []byte
		packed bool
		stride int
	}{{plain, false, 64}, {packed, true, 4}} {
		got, err := decodeSpec(c.enc)
		if err != nil {
			t.Fatalf("version %d: %v", c.enc[0], err)
		}
		l, err := computeLayout(got, minPageSize)
		if err != nil {
			t.Fatal(err)
		}
		if got.Packed != c.packed || l.cols[0].stride != c.stride || !bytes.Equal(l.enc, c.enc) {
			t.Errorf("version %d: packed %t, stride %d, re-encoded %x; want %t, %d, %x", c.enc[0], got.Packed, l.cols[0].stride, l.enc, c.packed, c.stride, c.enc)
		}
	}
	bad := bytes.Clone(packed)
	bad[len(bad)-1] = 3
	if _, err := decodeSpec(bad); err == nil || !strings.Contains(err.Error(), "flags 0x3") {
		t.Errorf("unknown flags: %v", err)
	}
	bad = bytes.Clone(plain)
	bad[0] = encVersion + 1
	if _, err := decodeSpec(bad); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("spec encoding version %d", encVersion+1)) {
		t.Errorf("version %d: %v", encVersion+1, err)
	}
}
