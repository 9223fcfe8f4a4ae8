// Command gearbench measures gear's collectives, store, sampling, collection and
// GPU paths. Collective benchmarks run under gearrun:
//
//	gearrun -np 2 gearbench allreduce --sizes 8,1K,64K,1M,16M,64M --json
//	gearbench store --json
//
// Every benchmark checks its results, reports medians, and prints text or, with
// --json, one JSON object per line.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

type benchmark struct {
	name    string
	summary string
	run     func(args []string, out io.Writer) error
}

var benchmarks = []benchmark{
	{"allreduce", "AllReduce (sum, float32) per size; run under gearrun", benchAllReduce},
	{"broadcast", "Broadcast from rank 0 per size; run under gearrun", benchBroadcast},
	{"allgather", "AllGather per size; run under gearrun", benchAllGather},
	{"reducescatter", "ReduceScatter (sum, float32) per size; run under gearrun", benchReduceScatter},
	{"alltoall", "AllToAll per size; run under gearrun", benchAllToAll},
	{"metrics", "what the library's metrics cost: 8 B AllReduce latency and 400 B inserts, off and on; run under gearrun", benchMetrics},
	{"setup", "time to a usable communicator and the shared memory it takes; run under gearrun", benchSetup},
	{"store", "shard insert rate and checkpoint/restore bandwidth", benchStore},
	{"sample", "selection rate (uniform, prioritized, top-k) and priority updates", benchSample},
	{"collect", "collection bandwidth, local and remote", benchCollect},
	{"launch", "wall and CPU time of whole commands against a peer (--vs)", benchLaunch},
	{"gpu", "GPU gather and weighted sampling against their limits", benchGPU},
	{"learner", "DQN learner gradient steps/s and frames/s, --device cpu|gpu", benchLearner},
	{"line", "time of one cache line passed between two CPUs: what shared-memory writers meet on", benchLine},
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage(os.Stderr)
		os.Exit(2)
	}
	for _, b := range benchmarks {
		if b.name == os.Args[1] {
			if err := b.run(os.Args[2:], os.Stdout); err != nil {
				fmt.Fprintf(os.Stderr, "gearbench %s: %v\n", b.name, err)
				os.Exit(1)
			}
			return
		}
	}
	fmt.Fprintf(os.Stderr, "gearbench: unknown benchmark %q\n", os.Args[1])
	usage(os.Stderr)
	os.Exit(2)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: gearbench BENCHMARK [flags]\n\nBenchmarks:")
	for _, b := range benchmarks {
		fmt.Fprintf(w, "  %-14s %s\n", b.name, b.summary)
	}
}

// kv is one field of a result line; a line keeps its fields in order.
type kv struct {
	Key   string
	Value any
}

// emitter prints result lines as JSON objects (one per line) or as aligned text.
type emitter struct {
	w    io.Writer
	json bool
}

// emit prints one result line.
func (e emitter) emit(fields ...kv) error {
	var b strings.Builder
	if e.json {
		b.WriteByte('{')
		for i, f := range fields {
			if i > 0 {
				b.WriteByte(',')
			}
			k, _ := json.Marshal(f.Key)
			v, err := json.Marshal(f.Value)
			if err != nil {
				return err
			}
			b.Write(k)
			b.WriteByte(':')
			b.Write(v)
		}
		b.WriteString("}\n")
	} else {
		for i, f := range fields {
			if i > 0 {
				b.WriteString("  ")
			}
			fmt.Fprintf(&b, "%s=%s", f.Key, textValue(f.Key, f.Value))
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(e.w, b.String())
	return err
}

func textValue(key string, v any) string {
	f, ok := v.(float64)
	if !ok {
		return fmt.Sprint(v)
	}
	switch {
	case strings.HasSuffix(key, "bw") || strings.HasSuffix(key, "bytes_per_s"):
		return humanRate(f)
	case key == "seconds":
		return fmt.Sprintf("%.3gs", f)
	}
	return fmt.Sprintf("%.4g", f)
}

// humanRate formats a bytes-per-second figure (decimal units, as nccl-tests).
func humanRate(bps float64) string {
	switch {
	case bps >= 1e9:
		return fmt.Sprintf("%.2fGB/s", bps/1e9)
	case bps >= 1e6:
		return fmt.Sprintf("%.2fMB/s", bps/1e6)
	default:
		return fmt.Sprintf("%.0fB/s", bps)
	}
}

// median returns the median of xs (0 for none). It sorts xs.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// parseSize reads a byte count such as 8, 1K, 64KiB, 1M, 16MB (binary multiples).
func parseSize(s string) (int, error) {
	t := strings.TrimSpace(s)
	mult := 1
	u := strings.ToUpper(t)
	for _, suf := range []struct {
		s string
		m int
	}{{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(u, suf.s) {
			mult = suf.m
			u = strings.TrimSuffix(u, suf.s)
			break
		}
	}
	n, err := strconv.Atoi(u)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("bad size %q: want a byte count such as 8, 1K, 64K, 1M", s)
	}
	return n * mult, nil
}

// parseSizes reads a comma-separated list of sizes.
func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		n, err := parseSize(f)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no sizes in %q", s)
	}
	return out, nil
}
