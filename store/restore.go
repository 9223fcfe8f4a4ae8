package store

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// ckptImage is where a checkpoint is decoded to: the column tables (in a new
// shard's segment, or in memory for tests) and the status records.
type ckptImage struct {
	l      *layout
	tables [][]byte
	status []byte
}

// ckptHeader is a checkpoint's header (and the next sequence from its end record).
type ckptHeader struct {
	spec    Spec
	enc     []byte
	label   uint64
	nextSeq uint64
}

// readCkptHeader reads and checks a checkpoint's header.
func readCkptHeader(r io.Reader) (ckptHeader, error) {
	var h ckptHeader
	var fixed [24]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return h, readErr("header", err)
	}
	if string(fixed[:8]) != ckptMagic {
		return h, corruptf("header: not a gear checkpoint (magic %q)", fixed[:8])
	}
	if v := binary.LittleEndian.Uint32(fixed[8:]); v != ckptVersion {
		return h, corruptf("header: version %d, want %d", v, ckptVersion)
	}
	n := binary.LittleEndian.Uint32(fixed[12:])
	if n > maxEncLen {
		return h, corruptf("header: spec of %d bytes, at most %d", n, maxEncLen)
	}
	rest := make([]byte, int(n)+4)
	if _, err := io.ReadFull(r, rest); err != nil {
		return h, readErr("header", err)
	}
	all := append(fixed[:], rest[:n]...)
	if got, want := crc(all), binary.LittleEndian.Uint32(rest[n:]); got != want {
		return h, corruptf("header: checksum %08x, want %08x", got, want)
	}
	spec, err := decodeSpec(rest[:n])
	if err != nil {
		return h, corruptf("header: %s", strings.TrimPrefix(err.Error(), "store: "))
	}
	h.spec, h.enc, h.label = spec, rest[:n], binary.LittleEndian.Uint64(fixed[16:])
	return h, nil
}

// corruptf makes an error wrapping ErrCorrupt: "store: checkpoint corrupt: <what>".
func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
}

// readErr reports a failed read of the named part: a file that ends early is
// corrupt; other errors are the reader's.
func readErr(where string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return corruptf("%s: file ends early", where)
	}
	return fmt.Errorf("%s: %w", where, err)
}

// readFrames reads every frame and the end record into img, checking order,
// bounds, checksums and lengths; errors name the column (or status table) and
// frame. It returns the committed-row count and the next insertion sequence that
// the end record holds.
func readFrames(ctx context.Context, r io.Reader, img *ckptImage, progress func(done, total int64)) (claimed, nextSeq uint64, err error) {
	spec := &img.l.spec
	n := spec.Capacity
	total := int64(len(img.status))
	for _, c := range img.l.cols {
		total += int64(n) * int64(c.stride)
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(maxFrameRaw),
		zstd.WithDecodeAllCapLimit(true), zstd.WithDecoderMaxWindow(maxFrameRaw))
	if err != nil {
		return 0, 0, err
	}
	defer dec.Close()

	var payload []byte
	var done int64
	var frames uint32
	// frame reads the next frame, which must be frame idx of section sec, at offset
	// off of dst, a whole number of units long; it decodes it into dst.
	frame := func(sec, idx uint32, dst []byte, off, unit int) (int, error) {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		where := fmt.Sprintf("%s frame %d", sectionName(spec, sec), idx)
		var fh [frameHdrSize]byte
		if _, err := io.ReadFull(r, fh[:]); err != nil {
			return 0, readErr(where, err)
		}
		if got, want := crc(fh[:32]), binary.LittleEndian.Uint32(fh[32:]); string(fh[:4]) != frameMagic || got != want {
			return 0, corruptf("%s: frame header damaged (checksum %08x, want %08x)", where, got, want)
		}
		fsec := binary.LittleEndian.Uint32(fh[4:])
		fidx := binary.LittleEndian.Uint32(fh[8:])
		foff := binary.LittleEndian.Uint64(fh[12:])
		raw := int(binary.LittleEndian.Uint32(fh[20:]))
		clen := int(binary.LittleEndian.Uint32(fh[24:]))
		if fsec != sec || fidx != idx || foff != uint64(off) {
			return 0, corruptf("%s: found %s frame %d at offset %d, want offset %d", where, sectionName(spec, fsec), fidx, foff, off)
		}
		if raw <= 0 || raw > maxFrameRaw || raw > len(dst)-off || raw%unit != 0 {
			return 0, corruptf("%s: %d bytes at offset %d do not fit the section's %d in units of %d", where, raw, off, len(dst), unit)
		}
		if clen <= 0 || clen > zstdBound(raw) {
			return 0, corruptf("%s: compressed length %d for %d bytes", where, clen, raw)
		}
		if cap(payload) < clen {
			payload = make([]byte, clen)
		}
		payload = payload[:clen]
		if _, err := io.ReadFull(r, payload); err != nil {
			return 0, readErr(where, err)
		}
		if got, want := crc(payload), binary.LittleEndian.Uint32(fh[28:]); got != want {
			return 0, corruptf("%s: checksum %08x, want %08x", where, got, want)
		}
		out, err := dec.DecodeAll(payload, dst[off:off:off+raw])
		if err != nil {
			return 0, corruptf("%s: %v", where, err)
		}
		if len(out) != raw || &out[0] != &dst[off] {
			return 0, corruptf("%s: decompressed to %d bytes, want %d", where, len(out), raw)
		}
		done += int64(raw)
		frames++
		if progress != nil {
			progress(done, total)
		}
		return raw, nil
	}
	// The rows, in chunks: one frame per column, all covering the same rows.
	for r0, idx := 0, uint32(0); r0 < n; idx++ {
		rows := 0
		for c, cl := range img.l.cols {
			raw, err := frame(uint32(c), idx, img.tables[c][:n*cl.stride], r0*cl.stride, cl.stride)
			if err != nil {
				return 0, 0, err
			}
			if c == 0 {
				rows = raw / cl.stride
			} else if raw/cl.stride != rows {
				return 0, 0, corruptf("%s frame %d: %d rows, the chunk has %d", sectionName(spec, uint32(c)), idx, raw/cl.stride, rows)
			}
		}
		r0 += rows
	}
	for off, idx := 0, uint32(0); off < len(img.status); idx++ {
		raw, err := frame(sectionStatus, idx, img.status, off, statusRecSize)
		if err != nil {
			return 0, 0, err
		}
		off += raw
	}
	var end [endSize]byte
	if _, err := io.ReadFull(r, end[:]); err != nil {
		return 0, 0, readErr("end record", err)
	}
	if got, want := crc(end[:28]), binary.LittleEndian.Uint32(end[28:]); string(end[:8]) != endMagic || got != want {
		return 0, 0, corruptf("end record damaged (checksum %08x, want %08x)", got, want)
	}
	if got := binary.LittleEndian.Uint32(end[8:]); got != frames {
		return 0, 0, corruptf("end record counts %d frames, read %d", got, frames)
	}
	var extra [1]byte
	if k, _ := io.ReadFull(r, extra[:]); k != 0 {
		return 0, 0, corruptf("bytes after the end record")
	}
	return binary.LittleEndian.Uint64(end[12:]), binary.LittleEndian.Uint64(end[20:]), nil
}

// zstdBound is the most a zstd frame of raw bytes can take (with slack).
func zstdBound(raw int) int { return raw + raw/128 + 1024 }

// ckptRecord is one decoded status record.
type ckptRecord struct {
	committed bool
	st        RowStatus
}

// checkStatus decodes and checks the status records: flags, sequences below nextSeq
// and unique, the count the end record claims.
func checkStatus(img *ckptImage, nextSeq, claimed uint64) ([]ckptRecord, error) {
	n := img.l.spec.Capacity
	recs := make([]ckptRecord, n)
	var seqs []uint64
	for i := range n {
		b := img.status[i*statusRecSize : (i+1)*statusRecSize]
		flags := binary.LittleEndian.Uint32(b[36:])
		switch flags {
		case 0:
			if !allZero(b) {
				return nil, corruptf("status table: row %d is free but its record is not empty", i)
			}
			continue
		case 1:
		default:
			return nil, corruptf("status table: row %d has flags %#x", i, flags)
		}
		st := RowStatus{
			Index:        i,
			Seq:          binary.LittleEndian.Uint64(b[0:]),
			Key:          binary.LittleEndian.Uint64(b[8:]),
			Priority:     math.Float64frombits(binary.LittleEndian.Uint64(b[16:])),
			InsertedAt:   int64(binary.LittleEndian.Uint64(b[24:])),
			TimesSampled: binary.LittleEndian.Uint32(b[32:]),
		}
		if st.Seq >= nextSeq {
			return nil, corruptf("status table: row %d has insertion sequence %d, beyond the checkpoint's %d", i, st.Seq, nextSeq)
		}
		if math.IsNaN(st.Priority) {
			return nil, corruptf("status table: row %d has priority NaN", i)
		}
		recs[i] = ckptRecord{committed: true, st: st}
		seqs = append(seqs, st.Seq)
	}
	if uint64(len(seqs)) != claimed {
		return nil, corruptf("status table: %d committed rows, end record says %d", len(seqs), claimed)
	}
	slices.Sort(seqs)
	for i := 1; i < len(seqs); i++ {
		if seqs[i] == seqs[i-1] {
			return nil, corruptf("status table: insertion sequence %d appears twice", seqs[i])
		}
	}
	return recs, nil
}

// readCheckpoint reads a whole checkpoint from r; image makes the destination once
// the header (and so the layout) is known.
func readCheckpoint(ctx context.Context, r io.Reader, image func(ckptHeader) (*ckptImage, error), progress func(done, total int64)) (ckptHeader, *ckptImage, []ckptRecord, error) {
	h, err := readCkptHeader(r)
	if err != nil {
		return h, nil, nil, err
	}
	img, err := image(h)
	if err != nil {
		return h, nil, nil, err
	}
	claimed, nextSeq, err := readFrames(ctx, r, img, progress)
	if err != nil {
		return h, nil, nil, err
	}
	h.nextSeq = nextSeq
	recs, err := checkStatus(img, h.nextSeq, claimed)
	if err != nil {
		return h, nil, nil, err
	}
	return h, img, recs, nil
}

// Restore makes a new shard called name from the checkpoint at path and returns the
// owner's handle. It checks everything (layout, every frame's checksum and length,
// the status records) and fails whole: on any error the new segment is removed, and
// the error names the column (or status table) and frame. WithSpec makes it fail
// unless the checkpoint has that layout; WithProgress reports progress. Restored
// rows keep their keys, priorities, times sampled and insertion sequences; the
// commit log starts empty, so readers begin with Rows (ReadCommits reports
// ErrMissed for older sequences).
func Restore(ctx context.Context, path, name string, opts ...Option) (*Shard, error) {
	o := collect(opts)
	if err := checkName(name); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, wrapOp("restore", err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<20)
	h, err := readCkptHeader(br)
	if err != nil {
		return nil, wrapOp("restore "+path, err)
	}
	if o.spec != nil {
		if err := diffSpecOf("checkpoint", h.spec, *o.spec); err != nil {
			return nil, wrapOp("restore "+path, fmt.Errorf("%w: %w", ErrLayout, err))
		}
	}
	rem, err := pickRemover(h.spec.Remover, o.remover)
	if err != nil {
		return nil, wrapOp("restore "+path, err)
	}
	l, err := computeLayout(h.spec, max(os.Getpagesize(), minPageSize))
	if err != nil {
		return nil, wrapOp("restore "+path, err)
	}
	s, err := create(name, l, o, rem, func(s *Shard) error {
		img := &ckptImage{l: l, tables: s.tables, status: make([]byte, l.spec.Capacity*statusRecSize)}
		claimed, nextSeq, err := readFrames(ctx, br, img, o.progress)
		if err != nil {
			return err
		}
		recs, err := checkStatus(img, nextSeq, claimed)
		if err != nil {
			return err
		}
		s.load(recs, nextSeq)
		return nil
	})
	if err != nil {
		return nil, wrapOp("restore "+path, err)
	}
	return s, nil
}

// load fills a new shard's status table and free queue from checked records.
func (s *Shard) load(recs []ckptRecord, nextSeq uint64) {
	s.free.reset()
	for i, rec := range recs {
		r := s.row(uint32(i))
		if !rec.committed {
			r.state.Store(freeWord(0))
			s.free.push(uint32(i))
			continue
		}
		r.seq.Store(rec.st.Seq)
		r.key.Store(rec.st.Key)
		r.priority.Store(math.Float64bits(rec.st.Priority))
		r.inserted.Store(rec.st.InsertedAt)
		r.sampled.Store(rec.st.TimesSampled)
		r.state.Store(committedWord(0))
	}
	s.log.tail.Store(nextSeq)
	s.claim.Store(nextSeq) // older rows are not in the log: the FIFO walk finds them by a scan
}
