package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/launch/launchtest"
	"github.com/gear-rl/gear/rank"
)

// collectiveLines decodes --json output and checks the fields and their order.
func collectiveLines(t *testing.T, out, op string, np int, sizes []int) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != len(sizes) {
		t.Fatalf("%s: %d lines for %d sizes:\n%s", op, len(lines), len(sizes), out)
	}
	for i, l := range lines {
		if !strings.HasPrefix(l, `{"op":"`+op+`","np":`) || !strings.Contains(l, `"seconds":`) || !strings.Contains(l, `"busbw":`) {
			t.Fatalf("%s: line %q", op, l)
		}
		var m struct {
			Op                    string
			NP, Bytes             int
			Seconds, Algbw, Busbw float64
		}
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%s: line %q: %v", op, l, err)
		}
		if m.Op != op || m.NP != np || m.Bytes != sizes[i] || m.Seconds <= 0 || m.Algbw <= 0 || m.Busbw < 0 {
			t.Fatalf("%s: line %q, want np %d bytes %d", op, l, np, sizes[i])
		}
	}
}

// Every collective benchmark in a world of one (no launcher).
func TestBenchCollectivesOneProcess(t *testing.T) {
	for op, run := range map[string]func([]string, *bytes.Buffer) error{
		"allreduce":     func(a []string, o *bytes.Buffer) error { return benchAllReduce(a, o) },
		"broadcast":     func(a []string, o *bytes.Buffer) error { return benchBroadcast(a, o) },
		"allgather":     func(a []string, o *bytes.Buffer) error { return benchAllGather(a, o) },
		"reducescatter": func(a []string, o *bytes.Buffer) error { return benchReduceScatter(a, o) },
		"alltoall":      func(a []string, o *bytes.Buffer) error { return benchAllToAll(a, o) },
	} {
		var out bytes.Buffer
		if err := run([]string{"--sizes", "8,4K", "--iters", "2", "--json", "--bind", "none"}, &out); err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		collectiveLines(t, out.String(), op, 1, []int{8, 4096})
	}
	var out bytes.Buffer
	if err := benchAllReduce([]string{"--sizes", "1X"}, &out); err == nil {
		t.Fatal("bad size accepted")
	}
}

// --memcpy adds the copy reference to every line: its rate, and the call's bus
// bandwidth as a fraction of it.
func TestBenchAllReduceMemcpy(t *testing.T) {
	var out bytes.Buffer
	if err := benchAllReduce([]string{"--sizes", "8,64K", "--iters", "3", "--json", "--bind", "none", "--memcpy"}, &out); err != nil {
		t.Fatal(err)
	}
	collectiveLines(t, out.String(), "allreduce", 1, []int{8, 64 << 10})
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m struct {
			Busbw   float64
			Memcpy  float64 `json:"memcpy_bytes_per_s"`
			PerCopy float64 `json:"busbw_per_memcpy"`
		}
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if m.Memcpy <= 0 {
			t.Fatalf("line %q: no memcpy rate", l)
		}
		if want := m.Busbw / m.Memcpy; m.PerCopy != want {
			t.Fatalf("line %q: busbw_per_memcpy %g, want busbw/memcpy = %g", l, m.PerCopy, want)
		}
	}
	out.Reset()
	if err := benchAllReduce([]string{"--sizes", "8", "--iters", "2", "--json", "--bind", "none"}, &out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "memcpy") {
		t.Fatalf("without --memcpy: %q", out.String())
	}
}

// Every collective benchmark in three real rank processes, checking its results.
func TestBenchCollectivesThreeRanks(t *testing.T) {
	launchtest.RunRanks(t, 3, func(t *testing.T, w *rank.World) {
		runs := 0
		open := func(ctx context.Context, opts ...collective.Option) (*collective.Comm, int, int, func(), error) {
			// One communicator per benchmark, on one world: each needs a name.
			runs++
			c, err := collective.New(ctx, w, append(opts, collective.WithName(fmt.Sprintf("bench%d", runs)))...)
			if err != nil {
				return nil, 0, 0, nil, err
			}
			return c, w.LocalRank(), w.LocalSize(), func() { c.Close() }, nil
		}
		for _, op := range []string{"allreduce", "broadcast", "allgather", "reducescatter", "alltoall"} {
			var out bytes.Buffer
			// 12 bytes is 3 floats: one per rank where the benchmark splits.
			if err := runCollectiveBench(op, []string{"--sizes", "12,96K,1M", "--iters", "2", "--json", "--bind", "none"}, &out, open); err != nil {
				t.Fatalf("rank %d: %s: %v", w.Rank(), op, err)
			}
			if w.Rank() == 0 {
				want := []int{12, 96 << 10, 1 << 20}
				if op == "allgather" || op == "reducescatter" || op == "alltoall" {
					// Whole blocks of floats per rank: 1 MiB is 3 x 87381 floats.
					want[2] = 87381 * 3 * 4
				}
				collectiveLines(t, out.String(), op, 3, want)
			} else if out.Len() != 0 {
				t.Fatalf("rank %d printed %q", w.Rank(), out.String())
			}
		}
	})
}

// allreduce --strategy and --layout: the layout-aware reduction, each strategy
// on four real ranks at two per virtual GPU, checked like the plain AllReduce.
func TestBenchAllReduceLayout(t *testing.T) {
	launchtest.RunRanks(t, 4, func(t *testing.T, w *rank.World) {
		runs := 0
		open := func(ctx context.Context, opts ...collective.Option) (*collective.Comm, int, int, func(), error) {
			runs++
			c, err := collective.New(ctx, w, append(opts, collective.WithName(fmt.Sprintf("bench%d", runs)))...)
			if err != nil {
				return nil, 0, 0, nil, err
			}
			return c, w.LocalRank(), w.LocalSize(), func() { c.Close() }, nil
		}
		for _, tc := range []struct{ flag, want string }{
			{"auto", "multi-ring"}, {"mpr", "multi-process"}, {"mrr", "multi-ring"}, {"har", "hierarchical"},
		} {
			var out bytes.Buffer
			args := []string{"--sizes", "16,96K", "--iters", "2", "--json", "--bind", "none", "--strategy", tc.flag, "--layout", "[[0,1],[2,3]]"}
			if err := runCollectiveBench("allreduce", args, &out, open); err != nil {
				t.Fatalf("rank %d: --strategy %s: %v", w.Rank(), tc.flag, err)
			}
			if w.Rank() != 0 {
				continue
			}
			collectiveLines(t, out.String(), "allreduce", 4, []int{16, 96 << 10})
			for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
				if !strings.HasPrefix(l, `{"op":"allreduce","np":4,"strategy":"`+tc.want+`","bytes":`) {
					t.Fatalf("--strategy %s: line %q, want strategy %s", tc.flag, l, tc.want)
				}
			}
		}
	})
}

func TestBenchLayoutFlags(t *testing.T) {
	for _, tc := range []struct {
		op   string
		args []string
		want string
	}{
		{"broadcast", []string{"--strategy", "har"}, "apply to allreduce only"},
		{"allreduce", []string{"--strategy", "ring"}, `--strategy "ring": want auto, mpr, mrr or har`},
		{"allreduce", []string{"--layout", "[[0],[0]]"}, "--layout: gmi: mapping"},
		{"allreduce", []string{"--layout", "[[0],[1]]", "--bind", "none"}, "names world ranks [0 1], but the communicator's ranks are world ranks [0]"},
	} {
		var out bytes.Buffer
		err := runCollectiveBench(tc.op, append(tc.args, "--sizes", "8", "--iters", "1"), &out, openWorld)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %v: %v, want %q", tc.op, tc.args, err, tc.want)
		}
	}
	// A world of one without a layout: multi-process, trivially.
	var out bytes.Buffer
	if err := runCollectiveBench("allreduce", []string{"--sizes", "8", "--iters", "1", "--json", "--bind", "none", "--strategy", "auto"}, &out, openWorld); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"strategy":"multi-process"`) {
		t.Errorf("output %q", out.String())
	}
}
