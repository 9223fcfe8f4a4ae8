package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/gmi"
	"github.com/gear-rl/gear/rank"
)

// The collective benchmarks run in every rank of a job started by gearrun. Rank 0
// prints one line per size: bytes, the median seconds per call, and the algorithm
// and bus bandwidths as nccl-tests defines them (bytes per second):
//
//	allreduce      algbw = bytes/s, busbw = algbw * 2(n-1)/n   (bytes: the buffer)
//	broadcast      algbw = bytes/s, busbw = algbw               (bytes: the buffer)
//	allgather      algbw = bytes/s, busbw = algbw * (n-1)/n     (bytes: the gathered total)
//	reducescatter  algbw = bytes/s, busbw = algbw * (n-1)/n     (bytes: the total sent by a rank)
//	alltoall       algbw = bytes/s, busbw = algbw * (n-1)/n     (bytes: the total sent by a rank)
//
// Timing, per size: a checked call, a few warm-up calls, then --iters repetitions
// of a batch of calls (about 4 MiB of payload, 1 to 1000 calls), each repetition
// between two barriers and timed on rank 0; the reported time is the median over
// repetitions of the batch time (closing barrier included) divided by its length. A final checked call closes
// the size. bench/peers/mpi_allreduce.c times MPI_Allreduce the same way.
//
// allreduce --strategy auto|mpr|mrr|har runs the layout-aware reduction
// (collective.Layout) of the GMI-to-GPU mapping that the launcher set
// (GEAR_GMI_LAYOUT, from gearrun --gmi-per-gpu K), or of --layout, with
// Algorithm 1's strategy or the one named; its lines carry the strategy. Its
// busbw uses the same factor as the plain AllReduce, so the strategies compare
// by time.

func benchAllReduce(args []string, out io.Writer) error {
	return runCollectiveBench("allreduce", args, out, openWorld)
}
func benchBroadcast(args []string, out io.Writer) error {
	return runCollectiveBench("broadcast", args, out, openWorld)
}
func benchAllGather(args []string, out io.Writer) error {
	return runCollectiveBench("allgather", args, out, openWorld)
}
func benchReduceScatter(args []string, out io.Writer) error {
	return runCollectiveBench("reducescatter", args, out, openWorld)
}
func benchAllToAll(args []string, out io.Writer) error {
	return runCollectiveBench("alltoall", args, out, openWorld)
}

// collectiveCases maps a benchmark to the case it times at one size.
var collectiveCases = map[string]func(c *collective.Comm, size int) *benchCase{
	"allreduce":     allReduceCase,
	"broadcast":     broadcastCase,
	"allgather":     allGatherCase,
	"reducescatter": reduceScatterCase,
	"alltoall":      allToAllCase,
}

// opener joins the job and builds the communicator; done undoes it.
type opener func(ctx context.Context, opts ...collective.Option) (c *collective.Comm, local, localSize int, done func(), err error)

// benchCase is one collective at one size on one rank: run calls it once (timed);
// fill and check bracket a checked call.
type benchCase struct {
	bytes int     // the size the line reports
	busbw float64 // busbw / algbw
	fill  func()
	run   func(ctx context.Context) error
	check func() error
}

// openWorld joins the job's world (rank.Init) and builds its communicator.
func openWorld(ctx context.Context, opts ...collective.Option) (*collective.Comm, int, int, func(), error) {
	w, err := rank.Init(ctx)
	if err != nil {
		return nil, 0, 0, nil, err
	}
	c, err := collective.New(ctx, w, append([]collective.Option{collective.WithTransport(os.Getenv(rank.EnvTransport))}, opts...)...)
	if err != nil {
		w.Close()
		return nil, 0, 0, nil, err
	}
	return c, w.LocalRank(), w.LocalSize(), func() { c.Close(); w.Close() }, nil
}

func runCollectiveBench(op string, args []string, out io.Writer, open opener) error {
	mk := collectiveCases[op]
	fs := flag.NewFlagSet(op, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	sizesFlag := fs.String("sizes", "8,1K,64K,1M,16M,64M", "comma-separated sizes in bytes (K, M, G: binary multiples)")
	iters := fs.Int("iters", 20, "timed repetitions per size (the median is reported)")
	jsonOut := fs.Bool("json", false, "print one JSON object per line")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after this long")
	// Tuning, for measuring switch points and pipeline shapes (every rank gets
	// the same flags): 0 keeps the default.
	def := collective.DefaultTuning()
	chunk := fs.String("chunk", "0", "frame payload (Tuning.ChunkBytes)")
	ringBytes := fs.String("ring", "0", "shared-memory ring capacity (Tuning.RingBytes)")
	small := fs.String("small", "-1", "largest recursive-doubling AllReduce (Tuning.SmallAllReduce); -1: default")
	smallB := fs.String("small-bcast", "-1", "largest tree Broadcast and Reduce (Tuning.SmallBroadcast); -1: default")
	stream := fs.String("stream", "default", "smallest call written with streaming stores (Tuning.StreamBytes); \"never\" for none")
	spin := fs.Duration("spin", -1, "shared-memory spin before sleeping (Tuning.Spin); negative: default")
	boardB := fs.String("board", "-1", "largest AllReduce on the shared-memory board, 0 for none (Tuning.BoardBytes); -1: default")
	memcpyRef := fs.Bool("memcpy", false, "also time a copy of each size on every rank at once (the same batches and repetitions), and report the call's bus bandwidth as a fraction of it")
	bind := fs.String("bind", "auto", "pin every rank to one core: auto (when the machine has a core per rank, counting the ranks of other network namespaces on it, as mpirun does), core, none")
	strategyFlag := fs.String("strategy", "", "allreduce only: run the layout-aware reduction of GEAR_GMI_LAYOUT (or --layout) with this strategy: auto (Algorithm 1), mpr, mrr, har")
	layoutFlag := fs.String("layout", "", "allreduce only: the GMI-to-GPU mapping list, e.g. [[0,1,2],[3,4,5]], instead of GEAR_GMI_LAYOUT; implies --strategy auto")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%v (flags: --sizes LIST --iters K --json --timeout D --memcpy --bind auto|core|none --chunk B --ring B --small B --small-bcast B --stream B|never --spin D --board B --strategy auto|mpr|mrr|har --layout LIST)", err)
	}
	layout, err := parseLayoutFlags(op, *strategyFlag, *layoutFlag)
	if err != nil {
		return err
	}
	tuning := def
	for _, f := range []struct {
		v, keep string
		dst     *int
	}{{*chunk, "0", &tuning.ChunkBytes}, {*ringBytes, "0", &tuning.RingBytes}, {*small, "-1", &tuning.SmallAllReduce}, {*smallB, "-1", &tuning.SmallBroadcast}, {*boardB, "-1", &tuning.BoardBytes}} {
		if f.v == f.keep {
			continue
		}
		n, err := parseSize(f.v)
		if err != nil {
			return err
		}
		*f.dst = n
	}
	if *chunk != "0" && *ringBytes == "0" {
		tuning.RingBytes = max(def.RingBytes, 8*(tuning.ChunkBytes+64))
	}
	if *small == "-1" {
		tuning.SmallAllReduce = min(def.SmallAllReduce, tuning.ChunkBytes)
	}
	if *smallB == "-1" {
		tuning.SmallBroadcast = min(def.SmallBroadcast, tuning.ChunkBytes)
	}
	tuning.Spin = *spin
	switch *stream {
	case "default":
	case "never":
		tuning.StreamBytes = -1
	default:
		n, err := parseSize(*stream)
		if err != nil {
			return err
		}
		tuning.StreamBytes = n
	}
	sizes, err := parseSizes(*sizesFlag)
	if err != nil {
		return err
	}
	if *iters < 1 {
		return errors.New("--iters must be at least 1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	switch *bind {
	case "auto", "core", "none":
	default:
		return fmt.Errorf("--bind %q: want auto, core or none", *bind)
	}
	c, local, localSize, done, err := open(ctx, collective.WithTuning(tuning))
	if err != nil {
		return err
	}
	defer done()
	var strategy kv
	if layout != nil {
		l, err := layout.build(ctx, c)
		if err != nil {
			return err
		}
		defer l.Close()
		mk = func(c *collective.Comm, size int) *benchCase { return allReduceLayoutCase(l, size) }
		strategy = kv{"strategy", string(l.Strategy())}
	}
	// auto binds when every rank on this machine's CPUs has a core of its own:
	// ranks of other hosts under this kernel (network namespaces) count too.
	if *bind == "core" || *bind == "auto" && max(localSize, c.CPURanks()) <= runtime.NumCPU() {
		if err := bindToCore(local % runtime.NumCPU()); err != nil {
			return err
		}
	}
	if err := warmUp(ctx, c); err != nil {
		return err
	}
	em := emitter{w: out, json: *jsonOut}
	times := make([]float64, *iters)
	for _, size := range sizes {
		bc := mk(c, size)
		if err := checkedCall(ctx, c, bc); err != nil {
			return fmt.Errorf("size %d: %w", size, err)
		}
		batch := batchLen(bc.bytes)
		for range min(batch, 10) {
			if err := bc.run(ctx); err != nil {
				return err
			}
		}
		if err := timeBatches(ctx, c, batch, times, bc.run); err != nil {
			return err
		}
		if err := checkedCall(ctx, c, bc); err != nil {
			return fmt.Errorf("size %d: %w", size, err)
		}
		sec := median(times)
		algbw := 0.0
		if sec > 0 {
			algbw = float64(bc.bytes) / sec
		}
		var copyBps float64
		if *memcpyRef && bc.bytes > 0 {
			// The reference: a copy of the same bytes on every rank at once,
			// in cache after the first, as a call's buffers are.
			src, dst := make([]byte, bc.bytes), make([]byte, bc.bytes)
			fillPattern(src, 7)
			if err := timeBatches(ctx, c, batch, times, func(context.Context) error { copy(dst, src); return nil }); err != nil {
				return fmt.Errorf("size %d: memcpy: %w", size, err)
			}
			if s := median(times); s > 0 {
				copyBps = float64(bc.bytes) / s
			}
		}
		if c.Rank() == 0 {
			fields := []kv{{"op", op}, {"np", c.Size()}}
			if layout != nil {
				fields = append(fields, strategy)
			}
			fields = append(fields, kv{"bytes", bc.bytes}, kv{"seconds", sec}, kv{"algbw", algbw}, kv{"busbw", algbw * bc.busbw})
			if copyBps > 0 {
				fields = append(fields, kv{"memcpy_bytes_per_s", copyBps}, kv{"busbw_per_memcpy", algbw * bc.busbw / copyBps})
			}
			if err := em.emit(fields...); err != nil {
				return err
			}
		}
	}
	return nil
}

// layoutRequest is what --strategy and --layout ask for.
type layoutRequest struct {
	strategy gmi.Strategy // "": Algorithm 1's choice
	mapping  gmi.Mapping  // nil: GEAR_GMI_LAYOUT
}

// parseLayoutFlags reads --strategy and --layout; nil when neither is set.
func parseLayoutFlags(op, strategy, layout string) (*layoutRequest, error) {
	if strategy == "" && layout == "" {
		return nil, nil
	}
	if op != "allreduce" {
		return nil, fmt.Errorf("--strategy and --layout apply to allreduce only")
	}
	req := &layoutRequest{}
	switch strategy {
	case "", "auto":
	case "mpr":
		req.strategy = gmi.MultiProcess
	case "mrr":
		req.strategy = gmi.MultiRing
	case "har":
		req.strategy = gmi.Hierarchical
	default:
		s, err := gmi.ParseStrategy(strategy)
		if err != nil {
			return nil, fmt.Errorf("--strategy %q: want auto, mpr, mrr or har", strategy)
		}
		req.strategy = s
	}
	if layout != "" {
		m, err := gmi.ParseMapping(layout)
		if err != nil {
			return nil, fmt.Errorf("--layout: %w", err)
		}
		req.mapping = m
	}
	return req, nil
}

// build makes the layout on c (collective: every rank of c).
func (r *layoutRequest) build(ctx context.Context, c *collective.Comm) (*collective.Layout, error) {
	var opts []collective.LayoutOption
	if r.strategy != "" {
		opts = append(opts, collective.WithStrategy(r.strategy))
	}
	if r.mapping != nil {
		return collective.NewLayout(ctx, c, r.mapping, opts...)
	}
	return collective.LayoutFromEnv(ctx, c, opts...)
}

// checkedCall runs one call on fresh inputs and checks it on every rank; the
// ranks agree on the outcome, so that all fail together.
func checkedCall(ctx context.Context, c *collective.Comm, bc *benchCase) error {
	bc.fill()
	if err := bc.run(ctx); err != nil {
		return err
	}
	bad := int32(0)
	cerr := bc.check()
	if cerr != nil {
		bad = 1
	}
	flag := []int32{bad}
	if err := collective.AllReduce(ctx, c, flag, collective.Max); err != nil {
		return err
	}
	if cerr != nil {
		return cerr
	}
	if flag[0] != 0 {
		return errors.New("another rank got a wrong result")
	}
	return nil
}

// warmUp runs small AllReduce calls for about warmTime before anything is
// timed: the runtime's start-up work (its first garbage collections) and the
// caches settle. Rank 0's clock decides when to stop; the ranks agree by a
// reduction after every 1000 calls.
func warmUp(ctx context.Context, c *collective.Comm) error {
	runtime.GC()
	start := time.Now()
	buf := make([]float32, 2)
	for {
		for range 1000 {
			if err := collective.AllReduce(ctx, c, buf, collective.Sum); err != nil {
				return err
			}
		}
		done := []int32{0}
		if c.Rank() == 0 && time.Since(start) > warmTime {
			done[0] = 1
		}
		if err := collective.AllReduce(ctx, c, done, collective.Max); err != nil {
			return err
		}
		if done[0] != 0 {
			return nil
		}
	}
}

const warmTime = 500 * time.Millisecond

// timeBatches times len(times) repetitions of batch calls of run, each
// between two barriers: times[i] is repetition i's time per call, the
// closing barrier included (the batch ends when every rank is done; a
// broadcast root finishes its part early).
func timeBatches(ctx context.Context, c *collective.Comm, batch int, times []float64, run func(context.Context) error) error {
	for it := range times {
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		t0 := time.Now()
		for range batch {
			if err := run(ctx); err != nil {
				return err
			}
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		times[it] = time.Since(t0).Seconds() / float64(batch)
	}
	return nil
}

// batchLen is how many calls one timed repetition makes: about 4 MiB of payload.
func batchLen(bytes int) int {
	if bytes <= 0 {
		return 1000
	}
	return max(1, min(1000, (4<<20)/bytes))
}

// value is the test pattern: element i of rank r's contribution.
func value(r, i int) float32 { return float32(r + 1 + i%7) }

func busFactor(n int) float64 { return float64(n-1) / float64(n) }

func allReduceCase(c *collective.Comm, size int) *benchCase {
	return allReduceWith(c, size, func(ctx context.Context, buf []float32) error {
		return collective.AllReduce(ctx, c, buf, collective.Sum)
	})
}

// allReduceLayoutCase is allReduceCase through a layout-aware reduction.
func allReduceLayoutCase(l *collective.Layout, size int) *benchCase {
	return allReduceWith(l.Comm(), size, func(ctx context.Context, buf []float32) error {
		return collective.LayoutAllReduce(ctx, l, buf, collective.Sum)
	})
}

func allReduceWith(c *collective.Comm, size int, allReduce func(ctx context.Context, buf []float32) error) *benchCase {
	n, r := c.Size(), c.Rank()
	buf := make([]float32, size/4)
	return &benchCase{
		bytes: len(buf) * 4, busbw: 2 * busFactor(n),
		fill: func() {
			for i := range buf {
				buf[i] = value(r, i)
			}
		},
		run: func(ctx context.Context) error { return allReduce(ctx, buf) },
		check: func() error {
			for i, v := range buf {
				if want := float32(n*(n+1)/2 + n*(i%7)); v != want {
					return fmt.Errorf("allreduce: element %d is %v, want %v", i, v, want)
				}
			}
			return nil
		},
	}
}

func broadcastCase(c *collective.Comm, size int) *benchCase {
	r := c.Rank()
	buf := make([]float32, size/4)
	return &benchCase{
		bytes: len(buf) * 4, busbw: 1,
		fill: func() {
			for i := range buf {
				buf[i] = value(r, i)
			}
		},
		run: func(ctx context.Context) error { return collective.Broadcast(ctx, c, buf, 0) },
		check: func() error {
			for i, v := range buf {
				if want := value(0, i); v != want {
					return fmt.Errorf("broadcast: element %d is %v, want %v", i, v, want)
				}
			}
			return nil
		},
	}
}

func allGatherCase(c *collective.Comm, size int) *benchCase {
	n, r := c.Size(), c.Rank()
	send := make([]float32, size/4/n)
	recv := make([]float32, len(send)*n)
	return &benchCase{
		bytes: len(recv) * 4, busbw: busFactor(n),
		fill: func() {
			for i := range send {
				send[i] = value(r, i)
			}
			clear(recv)
		},
		run: func(ctx context.Context) error { return collective.AllGather(ctx, c, send, recv) },
		check: func() error {
			for i, v := range recv {
				if want := value(i/len(send), i%len(send)); v != want {
					return fmt.Errorf("allgather: element %d is %v, want %v", i, v, want)
				}
			}
			return nil
		},
	}
}

func reduceScatterCase(c *collective.Comm, size int) *benchCase {
	n, r := c.Size(), c.Rank()
	recv := make([]float32, size/4/n)
	send := make([]float32, len(recv)*n)
	return &benchCase{
		bytes: len(send) * 4, busbw: busFactor(n),
		fill: func() {
			for i := range send {
				send[i] = value(r, i)
			}
		},
		run: func(ctx context.Context) error { return collective.ReduceScatter(ctx, c, send, recv, collective.Sum) },
		check: func() error {
			for i, v := range recv {
				j := r*len(recv) + i
				if want := float32(n*(n+1)/2 + n*(j%7)); v != want {
					return fmt.Errorf("reducescatter: element %d is %v, want %v", i, v, want)
				}
			}
			return nil
		},
	}
}

func allToAllCase(c *collective.Comm, size int) *benchCase {
	n, r := c.Size(), c.Rank()
	send := make([]float32, size/4/n*n)
	recv := make([]float32, len(send))
	blk := len(send) / n
	return &benchCase{
		bytes: len(send) * 4, busbw: busFactor(n),
		fill: func() {
			for i := range send {
				send[i] = value(r, i)
			}
			clear(recv)
		},
		run: func(ctx context.Context) error { return collective.AllToAll(ctx, c, send, recv) },
		check: func() error {
			for i, v := range recv {
				from, k := i/blk, i%blk
				if want := value(from, r*blk+k); v != want {
					return fmt.Errorf("alltoall: element %d is %v, want %v", i, v, want)
				}
			}
			return nil
		},
	}
}

// bindToCore pins every thread of this process to CPU cpu (threads started later
// inherit it), as mpirun binds ranks to cores by default when there is a core
// per rank: two spinning ranks left to the scheduler may share one core, each
// burning its time slice while the other waits for the core.
//
// It keeps GOMAXPROCS as it was. The Go runtime (1.25 and later) follows the
// process's CPU mask and would drop GOMAXPROCS to 1 within a second of the
// pinning; then the rank's spinning wait holds the only P, and its reader and
// timer goroutines wait for it. Beside two busy processes that cost gear's np=2
// TCP AllReduce 8 B 52 µs against 43 kept, and 1 MiB 2.57 ms against 1.85
// (docs/benchmarks.md, "TCP beside busy processes").
func bindToCore(cpu int) error {
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0)) // set: the runtime no longer follows the mask
	var set unix.CPUSet
	set.Set(cpu)
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("bind to CPU %d: %w", cpu, err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
			return fmt.Errorf("bind thread %d to CPU %d: %w", tid, cpu, err)
		}
	}
	return nil
}
