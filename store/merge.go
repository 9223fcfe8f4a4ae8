package store

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
)

// WithLabel makes Checkpoint record label in the checkpoint's header, for the
// caller to tell checkpoints apart (which generation of a job, and which of how
// many trainers, wrote it); ReadCheckpointInfo returns it. The default is 0.
func WithLabel(label uint64) Option { return func(o *options) { o.label = label } }

// CheckpointInfo is what a checkpoint's header and end record say.
type CheckpointInfo struct {
	Spec    Spec
	Label   uint64 // WithLabel's, 0 without
	Rows    uint64 // committed rows it holds
	NextSeq uint64 // the shard's next insertion sequence when it was written
}

// ReadCheckpointInfo reads the header and end record of the checkpoint at path,
// checking their checksums but not the frames between (Restore and
// MergeCheckpoint check those).
func ReadCheckpointInfo(path string) (CheckpointInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return CheckpointInfo{}, wrapOp("checkpoint info", err)
	}
	defer f.Close()
	h, err := readCkptHeader(bufio.NewReader(f))
	if err != nil {
		return CheckpointInfo{}, wrapOp("checkpoint info "+path, err)
	}
	var end [endSize]byte
	if _, err := f.Seek(-endSize, io.SeekEnd); err != nil {
		return CheckpointInfo{}, wrapOp("checkpoint info "+path, corruptf("no end record: %v", err))
	}
	if _, err := io.ReadFull(f, end[:]); err != nil {
		return CheckpointInfo{}, wrapOp("checkpoint info "+path, readErr("end record", err))
	}
	if got, want := crc(end[:28]), binary.LittleEndian.Uint32(end[28:]); string(end[:8]) != endMagic || got != want {
		return CheckpointInfo{}, wrapOp("checkpoint info "+path, corruptf("end record damaged (checksum %08x, want %08x)", got, want))
	}
	return CheckpointInfo{Spec: h.spec.normalized(), Label: h.label,
		Rows: binary.LittleEndian.Uint64(end[12:]), NextSeq: binary.LittleEndian.Uint64(end[20:])}, nil
}

// MergeCheckpoint inserts the committed rows of the checkpoint at path into this
// shard, oldest first, with their keys, priorities, times sampled and commit
// times; each gets a new insertion sequence of this shard. The checkpoint may
// have another capacity and remover, but its columns must be this shard's (else
// the error wraps ErrLayout and names the column). The whole checkpoint is read
// and checked first, so a corrupt one merges nothing. Allocate waits, until ctx
// is done, while no row is free and none can be evicted; give the shard room
// for the rows. It returns how many rows it merged.
func (s *Shard) MergeCheckpoint(ctx context.Context, path string) (int, error) {
	if s.closed.Load() {
		return 0, ErrClosed
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, wrapOp("merge", err)
	}
	defer f.Close()
	_, img, recs, err := readCheckpoint(ctx, bufio.NewReaderSize(f, 1<<20), func(h ckptHeader) (*ckptImage, error) {
		if err := s.sameColumns("checkpoint", h.spec); err != nil {
			return nil, err
		}
		l, err := computeLayout(h.spec, s.l.pageSize)
		if err != nil {
			return nil, err
		}
		img := &ckptImage{l: l, status: make([]byte, l.spec.Capacity*statusRecSize)}
		for _, c := range l.cols {
			img.tables = append(img.tables, make([]byte, l.spec.Capacity*c.stride))
		}
		return img, nil
	}, nil)
	if err != nil {
		return 0, wrapOp(fmt.Sprintf("merge %s into %q", path, s.name), err)
	}
	var rows []RowStatus
	for _, r := range recs {
		if r.committed {
			rows = append(rows, r.st)
		}
	}
	n, err := s.mergeRows(ctx, rows, func(col int, st RowStatus) []byte {
		cl := img.l.cols[col]
		off := st.Index * cl.stride
		return img.tables[col][off : off+cl.blockBytes]
	})
	if err != nil {
		return n, wrapOp(fmt.Sprintf("merge %s into %q", path, s.name), err)
	}
	return n, nil
}

// MergeFrom inserts the selectable rows of src (another shard, of the same
// columns) into this one, as MergeCheckpoint does. Rows src commits or removes
// meanwhile may or may not be merged; give src no writers.
func (s *Shard) MergeFrom(ctx context.Context, src *Shard) (int, error) {
	if s.closed.Load() || src.closed.Load() {
		return 0, ErrClosed
	}
	if err := s.sameColumns(fmt.Sprintf("shard %q", src.name), src.l.spec); err != nil {
		return 0, wrapOp(fmt.Sprintf("merge %q into %q", src.name, s.name), err)
	}
	var rows []RowStatus
	for st := range src.Rows() {
		rows = append(rows, st)
	}
	n, err := s.mergeRows(ctx, rows, func(col int, st RowStatus) []byte { return src.block(col, uint32(st.Index)) })
	if err != nil {
		return n, wrapOp(fmt.Sprintf("merge %q into %q", src.name, s.name), err)
	}
	return n, nil
}

// sameColumns checks that other (a checkpoint's or a shard's spec) has this
// shard's columns, whatever its capacity, remover, block alignment and
// packing (rows are copied block by block, whatever the strides).
func (s *Shard) sameColumns(holder string, other Spec) error {
	o := other.normalized()
	o.Capacity, o.Remover = s.l.spec.Capacity, s.l.spec.Remover
	o.BlockAlign, o.Packed = s.l.spec.BlockAlign, s.l.spec.Packed
	if err := diffSpecOf(holder, o, s.l.spec); err != nil {
		return fmt.Errorf("%w: %w", ErrLayout, err)
	}
	return nil
}

// mergeRows writes rows (oldest first) into new rows of s, block by block.
func (s *Shard) mergeRows(ctx context.Context, rows []RowStatus, block func(col int, st RowStatus) []byte) (int, error) {
	slices.SortFunc(rows, func(a, b RowStatus) int { return cmp.Compare(a.Seq, b.Seq) })
	for k, st := range rows {
		p, err := s.Allocate(ctx)
		if err != nil {
			return k, fmt.Errorf("row %d of %d: %w", k, len(rows), err)
		}
		for col := range s.l.cols {
			copy(p.Block(col), block(col, st))
		}
		if err := p.commitAs(st); err != nil {
			return k, err
		}
	}
	return len(rows), nil
}

// commitAs commits p with st's key, priority, times sampled and commit time
// (Commit's steps, with those fields taken from st).
func (p Pending) commitAs(st RowStatus) error {
	s := p.s
	if math.IsNaN(st.Priority) {
		return fmt.Errorf("store: merge row %d into %q: priority is NaN", p.idx, s.name)
	}
	r := s.row(p.idx)
	if r.state.Load() != p.word {
		return fmt.Errorf("store: merge row %d into %q: %w", p.idx, s.name, ErrNotPending)
	}
	r.key.Store(st.Key)
	r.priority.Store(math.Float64bits(st.Priority))
	r.sampled.Store(st.TimesSampled)
	r.inserted.Store(st.InsertedAt)
	c := committingWord(p.word)
	if !r.state.CompareAndSwap(p.word, c) {
		return fmt.Errorf("store: merge row %d into %q: %w", p.idx, s.name, ErrNotPending)
	}
	r.seq.Store(s.log.append(p.idx))
	if !r.state.CompareAndSwap(c, committedWord(genOf(p.word))) {
		return fmt.Errorf("store: merge row %d into %q: reclaimed while committing: %w", p.idx, s.name, ErrNotPending)
	}
	return nil
}
