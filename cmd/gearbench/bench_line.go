package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/gear-rl/gear/internal/cpuline"
)

// The line benchmark times one cache line passed between the first two CPUs
// of this process (internal/cpuline): --trials measurements of --rounds
// hand-overs each, a line each, and their median. gear's writer processes
// meet on a few such lines per row, so python/bench.py's two writers against
// one moves with this figure; on a virtual machine it changes with where the
// host places the virtual CPUs (docs/benchmarks.md, "Rows given back in row
// order").
func benchLine(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("line", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	rounds := fs.Int("rounds", 2000000, "hand-overs of one measurement (at least 8)")
	trials := fs.Int("trials", 5, "measurements (the median is reported last)")
	gap := fs.Duration("gap", 0, "pause between measurements, to watch the figure change")
	jsonOut := fs.Bool("json", false, "print one JSON object per line")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *trials < 1 {
		return fmt.Errorf("--trials %d: want at least 1", *trials)
	}
	e := emitter{w: out, json: *jsonOut}
	var ns []float64
	for i := range *trials {
		if i > 0 {
			time.Sleep(*gap)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		r, err := cpuline.Measure(ctx, *rounds)
		cancel()
		if err != nil {
			return err
		}
		ns = append(ns, r.NsPerLine())
		if err := e.emit(kv{"bench", "line"}, kv{"trial", i + 1}, kv{"cpus", fmt.Sprintf("%d,%d", r.CPUs[0], r.CPUs[1])},
			kv{"rounds", r.Rounds}, kv{"ns_per_line", r.NsPerLine()}); err != nil {
			return err
		}
	}
	return e.emit(kv{"bench", "line"}, kv{"trials", *trials}, kv{"median_ns_per_line", median(ns)})
}
