package store

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/errgroup"
)

// A checkpoint file:
//
//	header   "GEARCKPT", version u32, spec length u32, label u64 (WithLabel), spec
//	         encoding, CRC-32C of the header so far u32
//	frames   the rows in chunks: for each chunk of rows, one frame per column (in
//	         column order) holding those rows' blocks; then the status table in
//	         frames of whole records. Each frame is a 36-byte header ("FRAM",
//	         section u32 (column index, or 0xFFFFFFF0 for the status table), frame
//	         index u32 (the chunk, or the status frame's number), offset in the
//	         section u64, raw length u32, compressed length u32, CRC-32C of the
//	         payload u32, CRC-32C of the header's first 32 bytes u32) and a zstd
//	         frame (which has its own content checksum)
//	end      "GEAREND1", frame count u32, committed rows u64, next insertion
//	         sequence u64, CRC-32C u32
//
// A column section is the column's table: Capacity blocks at the block stride, the
// blocks of rows not committed zeroed. The status section is Capacity records of 40
// bytes: insertion sequence, key, priority bits, commit time (u64 each), times
// sampled u32, flags u32 (1: committed). All integers are little-endian.
const (
	ckptMagic        = "GEARCKPT"
	ckptVersion      = 1
	frameMagic       = "FRAM"
	endMagic         = "GEAREND1"
	sectionStatus    = 0xFFFFFFF0
	statusRecSize    = 40
	frameHdrSize     = 36
	endSize          = 32
	defaultFrameSize = 4 << 20
	maxFrameRaw      = 64 << 20
)

func crc(b []byte) uint32 { return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) }

// sectionName names a section in errors: `column "obs"` or "status table".
func sectionName(spec *Spec, section uint32) string {
	if section == sectionStatus {
		return "status table"
	}
	if int(section) < len(spec.Columns) {
		return fmt.Sprintf("column %q", spec.Columns[section].Name)
	}
	return fmt.Sprintf("section %d", section)
}

func encoderLevel(level int) zstd.EncoderLevel {
	switch {
	case level <= 1:
		return zstd.SpeedFastest
	case level == 2:
		return zstd.SpeedDefault
	case level == 3:
		return zstd.SpeedBetterCompression
	}
	return zstd.SpeedBestCompression
}

// ckptJob is one chunk of rows (a frame per column) or one status frame on its way
// through the checkpoint pipeline.
type ckptJob struct {
	index  uint32
	r0, r1 int  // rows
	status bool // a status frame (r0, r1: records)
	raw    []byte
	frames []ckptFrame
	done   chan struct{}
}

type ckptFrame struct {
	section uint32
	off     uint64
	rawLen  int
	out     []byte
}

// Checkpoint writes the shard to path: committed rows (blocks and status), zstd
// compressed in checksummed frames, into a temporary file in path's directory that
// is synced and renamed over path (and the directory synced), so path always holds
// a whole checkpoint, the previous one or this one.
//
// Writers may go on inserting meanwhile. The rows are copied in chunks of about the
// frame size (all columns of a chunk at once), and a row is kept if it was committed
// when its chunk was copied and unchanged after: every row in the checkpoint is
// intact, though rows of different chunks are taken at different moments. The
// checkpoint takes no pins, so a checkpointing process that dies leaves nothing
// behind but its temporary file, which the next checkpoint to path removes.
// Options: WithProgress, WithFrameSize, WithCompressionLevel, WithLabel.
func (s *Shard) Checkpoint(ctx context.Context, path string, opts ...Option) (err error) {
	if s.closed.Load() {
		return ErrClosed
	}
	o := collect(opts)
	frameSize := o.frameSize
	if frameSize <= 0 {
		frameSize = defaultFrameSize
	}
	frameSize = min(frameSize, maxFrameRaw)
	n := int(s.cap)
	rowBytes := 0
	for _, c := range s.l.cols {
		rowBytes += c.stride
	}
	chunkRows := max(frameSize/rowBytes, 1)
	statusRows := max(frameSize/statusRecSize, 1)
	total := int64(n) * int64(rowBytes+statusRecSize)
	// The status records, filled in as chunks are copied.
	records := make([]byte, n*statusRecSize)
	var committed atomic.Uint64

	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	removeStaleTemps(dir, base)
	f, err := os.CreateTemp(dir, tempPrefix(base, os.Getpid())+"*")
	if err != nil {
		return wrapOp(fmt.Sprintf("checkpoint %q", s.name), err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	w := bufio.NewWriterSize(f, 1<<20)
	hdr := []byte(ckptMagic)
	hdr = binary.LittleEndian.AppendUint32(hdr, ckptVersion)
	hdr = binary.LittleEndian.AppendUint32(hdr, uint32(len(s.l.enc)))
	hdr = binary.LittleEndian.AppendUint64(hdr, o.label)
	hdr = append(hdr, s.l.enc...)
	hdr = binary.LittleEndian.AppendUint32(hdr, crc(hdr))
	if _, err := w.Write(hdr); err != nil {
		return wrapOp(fmt.Sprintf("checkpoint %q to %s", s.name, tmp), err)
	}

	workers := min(max(runtime.GOMAXPROCS(0), 1), 8)
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(encoderLevel(o.level)), zstd.WithEncoderConcurrency(workers))
	if err != nil {
		return wrapOp(fmt.Sprintf("checkpoint %q", s.name), err)
	}
	defer enc.Close()

	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(gctx)
	window := workers + 2
	jobs := make(chan *ckptJob)
	order := make(chan *ckptJob, window)
	free := make(chan *ckptJob, window) // recycled jobs and their buffers
	for range window {
		free <- &ckptJob{}
	}
	var chunksDone sync.WaitGroup

	// Feeder: plans the jobs in file order.
	g.Go(func() error {
		defer close(jobs)
		defer close(order)
		send := func(fill func(j *ckptJob)) error {
			var j *ckptJob
			select {
			case j = <-free:
			case <-gctx.Done():
				return gctx.Err()
			}
			fill(j)
			j.done = make(chan struct{})
			select {
			case order <- j:
			case <-gctx.Done():
				return gctx.Err()
			}
			select {
			case jobs <- j:
			case <-gctx.Done():
				return gctx.Err()
			}
			return nil
		}
		for r0, idx := 0, 0; r0 < n; r0, idx = r0+chunkRows, idx+1 {
			chunksDone.Add(1)
			if err := send(func(j *ckptJob) {
				j.index, j.r0, j.r1, j.status = uint32(idx), r0, min(r0+chunkRows, n), false
			}); err != nil {
				chunksDone.Done()
				return err
			}
		}
		chunksDone.Wait() // the status records are complete
		for r0, idx := 0, 0; r0 < n; r0, idx = r0+statusRows, idx+1 {
			if err := send(func(j *ckptJob) {
				j.index, j.r0, j.r1, j.status = uint32(idx), r0, min(r0+statusRows, n), true
			}); err != nil {
				return err
			}
		}
		return nil
	})
	// Workers: copy a chunk (and check its rows), compress its frames.
	for range workers {
		g.Go(func() error {
			for j := range jobs {
				if j.status {
					s.statusFrame(j, records, enc)
				} else {
					s.chunkFrames(j, records, &committed, enc)
					chunksDone.Done()
				}
				close(j.done)
			}
			return nil
		})
	}
	// Writer: this goroutine, in order.
	var done int64
	var frames uint32
	werr := func() error {
		for j := range order {
			select {
			case <-j.done:
			case <-gctx.Done():
				return gctx.Err()
			}
			for _, fr := range j.frames {
				var fh [frameHdrSize]byte
				copy(fh[0:], frameMagic)
				binary.LittleEndian.PutUint32(fh[4:], fr.section)
				binary.LittleEndian.PutUint32(fh[8:], j.index)
				binary.LittleEndian.PutUint64(fh[12:], fr.off)
				binary.LittleEndian.PutUint32(fh[20:], uint32(fr.rawLen))
				binary.LittleEndian.PutUint32(fh[24:], uint32(len(fr.out)))
				binary.LittleEndian.PutUint32(fh[28:], crc(fr.out))
				binary.LittleEndian.PutUint32(fh[32:], crc(fh[:32]))
				if _, err := w.Write(fh[:]); err != nil {
					return err
				}
				if _, err := w.Write(fr.out); err != nil {
					return err
				}
				frames++
				done += int64(fr.rawLen)
				if o.progress != nil {
					o.progress(done, total)
				}
			}
			free <- j
		}
		return nil
	}()
	if werr != nil {
		cancel()
	}
	gerr := g.Wait()
	if werr == nil && gerr == nil && ctx.Err() != nil {
		gerr = ctx.Err()
	}
	if err := errors.Join(werr, gerr); err != nil {
		return wrapOp(fmt.Sprintf("checkpoint %q to %s", s.name, path), err)
	}

	// Every recorded row was committed before this: its sequence is below the end.
	end := []byte(endMagic)
	end = binary.LittleEndian.AppendUint32(end, frames)
	end = binary.LittleEndian.AppendUint64(end, committed.Load())
	end = binary.LittleEndian.AppendUint64(end, s.log.end())
	end = binary.LittleEndian.AppendUint32(end, crc(end))
	if _, err := w.Write(end); err != nil {
		return wrapOp(fmt.Sprintf("checkpoint %q to %s", s.name, tmp), err)
	}
	if err := w.Flush(); err != nil {
		return wrapOp(fmt.Sprintf("checkpoint %q to %s", s.name, tmp), err)
	}
	if err := f.Sync(); err != nil {
		return wrapOp(fmt.Sprintf("checkpoint %q: sync %s", s.name, tmp), err)
	}
	if err := f.Close(); err != nil {
		return wrapOp(fmt.Sprintf("checkpoint %q: close %s", s.name, tmp), err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return wrapOp(fmt.Sprintf("checkpoint %q", s.name), err)
	}
	if err := syncDir(dir); err != nil {
		return wrapOp(fmt.Sprintf("checkpoint %q: sync directory %s", s.name, dir), err)
	}
	return nil
}

// chunkFrames copies rows [j.r0, j.r1) of every column, keeps the rows that were
// committed before and unchanged after the copy (zeroing the others), records
// their status, and compresses one frame per column.
func (s *Shard) chunkFrames(j *ckptJob, records []byte, committed *atomic.Uint64, enc *zstd.Encoder) {
	rows := j.r1 - j.r0
	size := 0
	for _, c := range s.l.cols {
		size += rows * c.stride
	}
	if cap(j.raw) < size {
		j.raw = make([]byte, size)
	}
	j.raw = j.raw[:size]
	var snapBuf [256]uint64
	snap := snapBuf[:0]
	if rows > len(snapBuf) {
		snap = make([]uint64, 0, rows)
	}
	for i := j.r0; i < j.r1; i++ {
		x := s.row(uint32(i)).state.Load()
		if phaseOf(x) != phaseCommitted || x&doomedBit != 0 {
			x = 0
		}
		snap = append(snap, x&^pinMask)
	}
	// Copy every column's blocks of the chunk.
	parts := make([][]byte, len(s.l.cols))
	off := 0
	for c, cl := range s.l.cols {
		n := rows * cl.stride
		parts[c] = j.raw[off : off+n]
		copy(parts[c], s.tables[c][j.r0*cl.stride:j.r1*cl.stride])
		off += n
	}
	// Keep the rows still as they were; zero the rest.
	for k, i := 0, j.r0; i < j.r1; k, i = k+1, i+1 {
		rec := records[i*statusRecSize : (i+1)*statusRecSize]
		clear(rec)
		r := s.row(uint32(i))
		keep := snap[k] != 0
		var st RowStatus
		if keep {
			st = r.load(i)
			keep = r.state.Load()&^pinMask == snap[k]
		}
		if !keep {
			for c, cl := range s.l.cols {
				clear(parts[c][k*cl.stride : (k+1)*cl.stride])
			}
			continue
		}
		binary.LittleEndian.PutUint64(rec[0:], st.Seq)
		binary.LittleEndian.PutUint64(rec[8:], st.Key)
		binary.LittleEndian.PutUint64(rec[16:], math.Float64bits(st.Priority))
		binary.LittleEndian.PutUint64(rec[24:], uint64(st.InsertedAt))
		binary.LittleEndian.PutUint32(rec[32:], st.TimesSampled)
		binary.LittleEndian.PutUint32(rec[36:], 1)
		committed.Add(1)
	}
	j.frames = j.frames[:0]
	for c, cl := range s.l.cols {
		var out []byte
		if c < cap(j.frames) {
			out = j.frames[:c+1][c].out
		}
		j.frames = append(j.frames, ckptFrame{
			section: uint32(c),
			off:     uint64(j.r0) * uint64(cl.stride),
			rawLen:  len(parts[c]),
			out:     enc.EncodeAll(parts[c], out[:0]),
		})
	}
}

// statusFrame compresses the status records [j.r0, j.r1).
func (s *Shard) statusFrame(j *ckptJob, records []byte, enc *zstd.Encoder) {
	raw := records[j.r0*statusRecSize : j.r1*statusRecSize]
	var out []byte
	if cap(j.frames) > 0 {
		out = j.frames[:1][0].out
	}
	j.frames = append(j.frames[:0], ckptFrame{
		section: sectionStatus,
		off:     uint64(j.r0) * statusRecSize,
		rawLen:  len(raw),
		out:     enc.EncodeAll(raw, out[:0]),
	})
}

// tempPrefix starts the name of a temporary checkpoint file: ".<base>.tmp-<pid>-".
func tempPrefix(base string, pid int) string {
	return "." + base + ".tmp-" + strconv.Itoa(pid) + "-"
}

// removeStaleTemps removes the temporary files that checkpoints to base by processes
// now dead left in dir.
func removeStaleTemps(dir, base string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	pre := "." + base + ".tmp-"
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), pre)
		if !ok {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid == os.Getpid() {
			continue
		}
		if _, alive := procIdent(pid); !alive {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
