package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gear-rl/gear/cmd/internal/progress"
	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/store"
)

// The store benchmark measures, in one run:
//
//	memcpy      single-thread copy of one item (Go's copy) into a region the size of
//	            the shard's column table, round-robin: the bandwidth an insert's
//	            write can at best reach.
//	insert      items/s and bytes/s of Allocate, copy, Commit, by 1, 2 and 4 writer
//	            processes (this binary re-executed as "gearbench store
//	            --writer-child", attached by name) into a full FIFO shard, so that
//	            every insert also evicts; and the ratio to 1 writer.
//	copy        the same processes copying items, with no Allocate or Commit, into
//	            their shares of regions of their own as large as the shard's
//	            table: how far the machine lets N processes scale at all.
//	checkpoint  Checkpoint of a shard to a file in --dir (zstd, fastest level), and
//	restore     Restore of that file into a new shard: shard bytes per second.
//
// Each figure is the median of --trials runs of --seconds each (the checkpoint and
// restore: of --trials runs). The writer counts take turns within each trial, on
// the same shard, and the writers of a run start at one moment and stop at
// another, both given by the parent: the rate is the items all of them inserted
// in that common interval, divided by its length. A ratio is the median of the
// trials' ratios to the 1-writer run of the same trial. Results are checked: every committed row carries its
// key in its first bytes and the rest of the writer's pattern, and a restored shard
// has the same contents as the original.

func benchStore(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("store", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	sizesFlag := fs.String("sizes", "400,4K,64K,1M", "item (trajectory) sizes in bytes")
	writersFlag := fs.String("writers", "1,2,4", "numbers of writer processes")
	seconds := fs.Float64("seconds", 1, "length of one timed run")
	trials := fs.Int("trials", 3, "timed runs per figure (the median is reported)")
	footprint := fs.String("footprint", "64M", "shard size for the insert runs (capacity = footprint / item size)")
	ckptSize := fs.String("ckpt-size", "256M", "shard size for checkpoint and restore (0: skip them)")
	dir := fs.String("dir", os.TempDir(), "directory for the checkpoint file (local disk)")
	jsonOut := fs.Bool("json", false, "print one JSON object per line")
	child := fs.String("writer-child", "", "internal: run as a writer process of the named shard")
	childID := fs.Int("writer-id", 0, "internal: the writer's number")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *child != "" {
		return storeWriterChild(*child, *childID)
	}
	sizes, err := parseSizes(*sizesFlag)
	if err != nil {
		return err
	}
	var writers []int
	for _, f := range strings.Split(*writersFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("bad writer count %q", f)
		}
		writers = append(writers, n)
	}
	foot, err := parseSize(*footprint)
	if err != nil {
		return err
	}
	ck, err := parseSize(*ckptSize)
	if err != nil {
		return err
	}
	if *trials < 1 || *seconds <= 0 {
		return fmt.Errorf("want --trials >= 1 and --seconds > 0")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	e := emitter{w: out, json: *jsonOut}
	run := time.Duration(*seconds * float64(time.Second))
	for _, size := range sizes {
		if size < 8 {
			return fmt.Errorf("item size %d: want at least 8 bytes", size)
		}
		bps := benchMemcpy(size, foot, run, *trials)
		if err := e.emit(kv{"op", "memcpy"}, kv{"bytes", size}, kv{"bytes_per_s", bps}); err != nil {
			return err
		}
		res, err := benchInsert(ctx, size, foot, writers, run, *trials)
		if err != nil {
			return fmt.Errorf("insert %d bytes: %w", size, err)
		}
		for _, r := range res {
			if err := e.emit(kv{"op", "insert"}, kv{"bytes", size}, kv{"writers", r.writers},
				kv{"items_per_s", r.items}, kv{"bytes_per_s", r.items * float64(size)}, kv{"vs_1_writer", r.ratio}); err != nil {
				return err
			}
		}
		for _, r := range res {
			if err := e.emit(kv{"op", "copy"}, kv{"bytes", size}, kv{"writers", r.writers},
				kv{"items_per_s", r.copyItems}, kv{"vs_1_writer", r.copyRatio}); err != nil {
				return err
			}
		}
	}
	if ck > 0 {
		return benchCheckpoint(ctx, e, ck, *dir, *trials, !*jsonOut)
	}
	return nil
}

func align64(n int) int { return (n + 63) &^ 63 }

// benchMemcpy copies size bytes at a time into a footprint-sized region, one block
// after another, and returns the median bytes per second.
func benchMemcpy(size, footprint int, run time.Duration, trials int) float64 {
	stride := align64(size)
	blocks := max(footprint/stride, 64)
	dst := make([]byte, blocks*stride)
	for i := range dst {
		dst[i] = byte(i) // fault the pages in
	}
	src := make([]byte, size)
	fillPattern(src, 1)
	var rates []float64
	for range trials {
		n, i := 0, 0
		start := time.Now()
		for time.Since(start) < run {
			for range 64 {
				copy(dst[i*stride:i*stride+size], src)
				if i++; i == blocks {
					i = 0
				}
			}
			n += 64
		}
		rates = append(rates, float64(n)*float64(size)/time.Since(start).Seconds())
	}
	return median(rates)
}

func fillPattern(b []byte, seed uint64) {
	x := seed
	for i := range b {
		x = x*6364136223846793005 + 1442695040888963407
		b[i] = byte(x >> 56)
	}
}

// insertResult is the insert and copy rates of one writer count: medians over the
// trials, and the medians of the trials' ratios to one writer.
type insertResult struct {
	writers              int
	items, ratio         float64
	copyItems, copyRatio float64
}

// benchInsert starts max(writers) child processes on a fresh shard, fills it, and
// then, in each trial, runs every writer count in turn (the first that many
// children), inserting and then copying. It returns one result per writer count.
func benchInsert(ctx context.Context, size, footprint int, writers []int, run time.Duration, trials int) ([]insertResult, error) {
	stride := align64(size)
	capacity := max(footprint/stride, 64)
	name := rank.SegmentName(rank.LocalJobID(), fmt.Sprintf("store.bench.%d", size))
	s, err := store.Create(name, store.Spec{Capacity: capacity, Columns: []store.Column{
		{Name: "data", DType: store.Uint8, Shape: []int{size}, Length: 1},
	}})
	if err != nil {
		return nil, err
	}
	defer s.Close()

	type proc struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *bufio.Reader
	}
	var procs []proc
	defer func() {
		for _, p := range procs {
			p.in.Close()
			if err := p.cmd.Wait(); err != nil {
				_ = p.cmd.Process.Kill()
			}
		}
	}()
	for w := range slices.Max(writers) {
		cmd := exec.CommandContext(ctx, os.Args[0], "store", "--writer-child", name, "--writer-id", strconv.Itoa(w+1))
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		outp, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		procs = append(procs, proc{cmd, in, bufio.NewReader(outp)})
	}
	// ask sends cmd to the first n children and returns their replies.
	ask := func(n int, cmd string) ([]string, error) {
		for _, p := range procs[:n] {
			if _, err := io.WriteString(p.in, cmd+"\n"); err != nil {
				return nil, err
			}
		}
		var replies []string
		for _, p := range procs[:n] {
			l, err := p.out.ReadString('\n')
			if err != nil {
				return nil, fmt.Errorf("writer process %d: %w", p.cmd.Process.Pid, err)
			}
			replies = append(replies, strings.TrimSpace(l))
		}
		return replies, nil
	}
	if _, err := ask(len(procs), "ready?"); err != nil {
		return nil, err
	}
	// Fill the shard first: the timed runs insert into a full shard.
	if _, err := ask(len(procs), fmt.Sprintf("warm %d", capacity/len(procs)+1)); err != nil {
		return nil, err
	}
	// timed runs op ("run" or "copy") in the first n children from a common start
	// to a common end, and returns the items per second of all of them together.
	timed := func(op string, n int) (float64, error) {
		start := time.Now().Add(20 * time.Millisecond)
		replies, err := ask(n, fmt.Sprintf("%s %d %d %d", op, start.UnixNano(), start.Add(run).UnixNano(), n))
		if err != nil {
			return 0, err
		}
		total := 0
		for _, r := range replies {
			k, err := strconv.Atoi(r)
			if err != nil || k <= 0 {
				return 0, fmt.Errorf("writer process said %q", r)
			}
			total += k
		}
		return float64(total) / run.Seconds(), nil
	}
	rates := make([][]float64, len(writers))
	ratios := make([][]float64, len(writers))
	copies := make([][]float64, len(writers))
	copyRatios := make([][]float64, len(writers))
	for range trials {
		var one, oneCopy float64
		for k, w := range writers {
			r, err := timed("run", w)
			if err != nil {
				return nil, err
			}
			c, err := timed("copy", w)
			if err != nil {
				return nil, err
			}
			if w == 1 {
				one, oneCopy = r, c
			}
			rates[k] = append(rates[k], r)
			copies[k] = append(copies[k], c)
			if one > 0 {
				ratios[k] = append(ratios[k], r/one)
				copyRatios[k] = append(copyRatios[k], c/oneCopy)
			}
		}
	}
	if _, err := ask(len(procs), "quit"); err != nil {
		return nil, err
	}
	for _, p := range procs {
		if err := p.cmd.Wait(); err != nil {
			return nil, fmt.Errorf("writer process %d: %w", p.cmd.Process.Pid, err)
		}
	}
	nprocs := len(procs)
	procs = nil
	// Check every committed row: its key in front, the writer's pattern after it.
	// The rows the writers had reserved and not used are free again.
	pattern := make([]byte, size)
	fillPattern(pattern, 1)
	rows := 0
	for st := range s.Rows() {
		v, err := s.Read(st.Ref())
		if err != nil {
			return nil, err
		}
		b := v.Block(0)
		ok := binary.LittleEndian.Uint64(b) == st.Key && string(b[8:]) == string(pattern[8:])
		v.Done()
		if !ok {
			return nil, fmt.Errorf("row %v holds a wrong payload", st.Ref())
		}
		rows++
	}
	if st := s.Stats(); rows != st.Committed || st.Writing != 0 || st.Reserved != 0 || st.Committed+st.Free != capacity || st.Free > nprocs*s.Capacity()/512 {
		return nil, fmt.Errorf("after the runs: %d rows read, %+v, capacity %d", rows, st, capacity)
	}
	var res []insertResult
	for k, w := range writers {
		r := insertResult{writers: w, items: median(rates[k]), copyItems: median(copies[k])}
		if len(ratios[k]) > 0 {
			r.ratio, r.copyRatio = median(ratios[k]), median(copyRatios[k])
		}
		res = append(res, r)
	}
	return res, nil
}

// storeWriterChild is a writer process: it attaches to the shard and answers the
// parent's commands on stdin, one line each: "ready?", "warm N" (insert N items),
// "run START END N" (insert from START to END, unix nanoseconds, as one of N
// writers; reply the number of items), "copy START END N" (copy items in the same
// way into this process's 1/N of a region of the table's size, with no Allocate
// or Commit), "quit".
func storeWriterChild(name string, id int) error {
	ctx := context.Background()
	s, err := store.Attach(ctx, name)
	if err != nil {
		return err
	}
	defer s.Close()
	size := s.BlockBytes(0)
	src := make([]byte, size)
	fillPattern(src, 1)
	seq := uint64(0)
	insert := func() error {
		p, err := s.Allocate(ctx)
		if err != nil {
			return err
		}
		b := p.Block(0)
		copy(b, src)
		key := uint64(id)<<40 | seq
		binary.LittleEndian.PutUint64(b, key)
		seq++
		_, err = p.CommitKey(key, 1)
		return err
	}
	// The copy runs write into a region of this process's own (warm fills it),
	// the writers' share of a table of the shard's size, round-robin.
	stride := s.BlockStride(0)
	var region []byte
	rows, next := 1, 0
	copyOne := func() error {
		if next >= rows {
			next = 0
		}
		copy(region[next*stride:next*stride+size], src)
		next++
		return nil
	}
	// timed runs f from start to end (unix nanoseconds) and returns how often.
	timed := func(f func() error, start, end int64) (int, error) {
		for time.Now().UnixNano() < start {
			if d := time.Duration(start - time.Now().UnixNano()); d > time.Millisecond {
				time.Sleep(d - time.Millisecond)
			}
		}
		n := 0
		for time.Now().UnixNano() < end {
			for range 8 {
				if err := f(); err != nil {
					return n, err
				}
			}
			n += 8
		}
		return n, nil
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "ready?":
			fmt.Println("ready")
		case "warm":
			region = make([]byte, len(s.ColumnTable(0)))
			for i := range region {
				region[i] = byte(i)
			}
			n, _ := strconv.Atoi(f[1])
			for range n {
				if err := insert(); err != nil {
					return err
				}
			}
			fmt.Println("ok")
		case "run", "copy":
			if len(f) != 4 {
				return fmt.Errorf("command %q: want START END WRITERS", in.Text())
			}
			start, err1 := strconv.ParseInt(f[1], 10, 64)
			end, err2 := strconv.ParseInt(f[2], 10, 64)
			writers, err3 := strconv.Atoi(f[3])
			if err := errors.Join(err1, err2, err3); err != nil || writers < 1 {
				return fmt.Errorf("command %q: %v", in.Text(), err)
			}
			op := insert
			if f[0] == "copy" {
				op = copyOne
				rows = max(len(region)/writers/stride, 1)
			}
			n, err := timed(op, start, end)
			if err != nil {
				return err
			}
			fmt.Println(n)
		case "quit":
			fmt.Println("bye")
			return nil
		default:
			return fmt.Errorf("unknown command %q", f[0])
		}
	}
	return in.Err()
}

// benchCheckpoint checkpoints and restores a shard of about size bytes.
func benchCheckpoint(ctx context.Context, e emitter, size int, dir string, trials int, bar bool) error {
	const item = 64 << 10
	capacity := max(size/item, 1)
	name := rank.SegmentName(rank.LocalJobID(), "store.bench.ckpt")
	s, err := store.Create(name, store.Spec{Capacity: capacity, Columns: []store.Column{
		{Name: "data", DType: store.Uint8, Shape: []int{item}, Length: 1},
	}})
	if err != nil {
		return err
	}
	defer s.Close()
	// Observations compress about 2:1: half of each 4 KiB random, half a pattern.
	for i := range capacity {
		p, err := s.Allocate(ctx)
		if err != nil {
			return err
		}
		b := p.Block(0)
		for off := 0; off < len(b); off += 4096 {
			fillPattern(b[off:off+2048], uint64(i*1000+off))
			for j := off + 2048; j < off+4096; j++ {
				b[j] = byte(j / 64)
			}
		}
		if _, err := p.Commit(float64(i)); err != nil {
			return err
		}
	}
	want := shardCRC(s)
	bytes := int64(capacity) * item
	path := filepath.Join(dir, fmt.Sprintf("gearbench-store-%d.ckpt", os.Getpid()))
	defer os.Remove(path)
	var ckRates, rsRates []float64
	var fileBytes int64
	for t := range trials {
		report, finish := progress.Bar(barFile(bar), fmt.Sprintf("checkpoint %d/%d", t+1, trials))
		start := time.Now()
		err := s.Checkpoint(ctx, path, store.WithProgress(report))
		finish()
		if err != nil {
			return err
		}
		ckRates = append(ckRates, float64(bytes)/time.Since(start).Seconds())
		if fi, err := os.Stat(path); err == nil {
			fileBytes = fi.Size()
		}
		report, finish = progress.Bar(barFile(bar), fmt.Sprintf("restore %d/%d", t+1, trials))
		start = time.Now()
		r, err := store.Restore(ctx, path, rank.SegmentName(rank.LocalJobID(), "store.bench.restored"), store.WithProgress(report))
		finish()
		if err != nil {
			return err
		}
		rsRates = append(rsRates, float64(bytes)/time.Since(start).Seconds())
		got := shardCRC(r)
		if err := r.Close(); err != nil {
			return err
		}
		if got != want {
			return errors.New("restored shard differs from the original")
		}
	}
	if err := e.emit(kv{"op", "checkpoint"}, kv{"bytes", bytes}, kv{"file_bytes", fileBytes}, kv{"bytes_per_s", median(ckRates)}); err != nil {
		return err
	}
	return e.emit(kv{"op", "restore"}, kv{"bytes", bytes}, kv{"bytes_per_s", median(rsRates)})
}

func barFile(on bool) *os.File {
	if on {
		return os.Stderr
	}
	return nil
}

// shardCRC is a checksum of a shard's committed rows (index, key, priority, blocks).
func shardCRC(s *store.Shard) uint32 {
	h := crc32.NewIEEE()
	var b [24]byte
	for st := range s.Rows() {
		binary.LittleEndian.PutUint64(b[0:], uint64(st.Index))
		binary.LittleEndian.PutUint64(b[8:], st.Key)
		binary.LittleEndian.PutUint64(b[16:], uint64(st.Priority))
		h.Write(b[:])
		for c := range s.Spec().Columns {
			off := s.BlockOffset(c, st.Index)
			h.Write(s.ColumnTable(c)[off : off+s.BlockBytes(c)])
		}
	}
	return h.Sum32()
}
