package gmi

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
)

// WriteText prints the topology for people (gearrun gpus).
func (t *Topology) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	switch t.Source {
	case SourceNVML:
		fmt.Fprintf(ew, "source: NVML")
		if t.Driver != "" {
			fmt.Fprintf(ew, " (driver %s)", t.Driver)
		}
		fmt.Fprintln(ew)
	case SourceFile:
		fmt.Fprintf(ew, "source: topology file %s\n", t.Path)
	default:
		fmt.Fprintf(ew, "source: none")
		if t.Reason != "" {
			fmt.Fprintf(ew, " (%s)", t.Reason)
		}
		fmt.Fprintln(ew)
	}
	mps := "not running"
	if t.MPS.Running {
		mps = "control daemon reachable"
	}
	if t.MPS.Detail != "" {
		mps += ": " + t.MPS.Detail
	}
	fmt.Fprintf(ew, "MPS: %s\n", mps)
	if len(t.GPUs) == 0 {
		fmt.Fprintln(ew, "no GPUs")
		return ew.err
	}
	tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tNAME\tSM\tMEMORY\tMIG\tUUID")
	for _, g := range t.GPUs {
		mig := "off"
		if g.MIGMode {
			mig = "on"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", g.Index, orDash(g.Name), g.Compute, bytesText(g.MemoryBytes), mig, orDash(g.UUID))
		for _, m := range g.MIG {
			fmt.Fprintf(tw, "  %d/%d\t%s\t\t%s\t\t%s\n", m.GPUInstance, m.ComputeInstance, m.Profile, bytesText(m.MemoryBytes), orDash(m.UUID))
		}
	}
	tw.Flush()
	return ew.err
}

// WriteText prints the plan for people (gearrun gmi plan).
func (p *Plan) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	if p.GPUsPerRank > 1 {
		fmt.Fprintf(ew, "ranks: %d on %d GPU(s) %v, %d GPUs per rank\n", p.Ranks, len(p.GPUs), p.GPUs, p.GPUsPerRank)
	} else {
		fmt.Fprintf(ew, "ranks: %d on %d GPU(s) %v, %d per GPU\n", p.Ranks, len(p.GPUs), p.GPUs, p.GMIPerGPU)
	}
	fmt.Fprintf(ew, "backend: %s (%s)\n", p.Backend, p.Why)
	fmt.Fprintf(ew, "mapping: %s\n", p.Mapping)
	fmt.Fprintf(ew, "strategy: %s (Algorithm 1: %s)\n", p.Strategy, p.StrategyWhy)
	if len(p.Schedule.Steps) > 0 {
		fmt.Fprintln(ew, "schedule:")
		p.Schedule.writeSteps(ew, "  ")
	}
	fmt.Fprintln(ew, "bindings:")
	tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  RANK\tGPU\tGMI\tDEVICE\tENV")
	for _, b := range p.Bindings {
		dev := strconv.Itoa(b.GPU)
		if len(b.GPUs) > 1 {
			dev = b.Env[EnvCUDAVisibleDevices]
		}
		if b.MIG != nil {
			dev = b.MIG.Profile
		} else if b.ThreadPercent > 0 {
			dev += " mps " + strconv.Itoa(b.ThreadPercent) + "%"
		}
		var env []string
		for _, kv := range b.Environ() {
			if !strings.HasPrefix(kv, EnvGMILayout+"=") {
				env = append(env, kv)
			}
		}
		fmt.Fprintf(tw, "  %d\t%d\t%d\t%s\t%s\n", b.Rank, b.GPU, b.Slot, dev, strings.Join(env, " "))
	}
	tw.Flush()
	fmt.Fprintf(ew, "every rank: %s=%s\n", EnvGMILayout, p.Mapping)
	for _, warn := range p.Warnings {
		fmt.Fprintf(ew, "warning: %s\n", warn)
	}
	return ew.err
}

// WriteText prints the schedule's steps, one line per step.
func (s Schedule) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	fmt.Fprintf(ew, "%s on %s\n", s.Strategy, s.Mapping)
	s.writeSteps(ew, "  ")
	return ew.err
}

func (s Schedule) writeSteps(w io.Writer, indent string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for i, st := range s.Steps {
		var gs []string
		for _, g := range st.Groups {
			gs = append(gs, g.text(st.Op))
		}
		fmt.Fprintf(tw, "%s%d\t%s\t%s\t%s\t%s\n", indent, i+1, st.Phase, st.Op, st.Groups[0].Link, strings.Join(gs, " "))
	}
	tw.Flush()
}

func (g Group) text(op Op) string {
	ids := make([]string, len(g.Ranks))
	for i, r := range g.Ranks {
		ids[i] = strconv.Itoa(r)
	}
	set := "{" + strings.Join(ids, ",") + "}"
	switch op {
	case OpReduce:
		return fmt.Sprintf("%s->%d", set, g.Root)
	case OpBroadcast:
		return fmt.Sprintf("%d->%s", g.Root, set)
	}
	return set
}

// WriteText prints the search table and its answer (gearrun gmi search).
func (r SearchResult) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GMI/GPU\tNUM_ENV\tTHROUGHPUT\tMEMORY\tSAT\tESTIMATE\tVERDICT")
	for i, row := range r.Rows {
		top, mem, sat, est := "-", "-", "-", "-"
		if row.Runnable {
			top = strconv.FormatFloat(row.Throughput, 'g', 6, 64)
			if row.Memory > 0 {
				mem = bytesText(uint64(row.Memory))
			}
		}
		if f := float64(row.Sat); !math.IsNaN(f) {
			sat = strconv.FormatFloat(f, 'f', 3, 64)
		}
		if row.Verdict == VerdictOK {
			est = strconv.FormatFloat(row.Estimate, 'g', 6, 64)
		}
		verdict := row.Verdict
		if row.Why != "" {
			verdict += ": " + row.Why
		}
		if i == r.BestRow {
			verdict += " (best)"
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\n", row.GMIPerGPU, row.NumEnv, top, mem, sat, est, verdict)
	}
	tw.Flush()
	if r.Found {
		fmt.Fprintf(ew, "best: %d GMIs per GPU, num_env %d (throughput %g per GMI, estimate %g on %d GPU(s))\n",
			r.Best.GMIPerGPU, r.Best.NumEnv, r.Best.Throughput, r.Best.Estimate, r.Config.GPUs)
	} else {
		fmt.Fprintln(ew, "best: none (no configuration ran twice in a series without saturating)")
	}
	return ew.err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// bytesText writes a byte count in binary units: "40.0 GiB".
func bytesText(b uint64) string {
	if b == 0 {
		return "-"
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f := float64(b)
	u := 0
	for f >= 1024 && u < len(units)-1 {
		f /= 1024
		u++
	}
	if u == 0 {
		return fmt.Sprintf("%d B", b)
	}
	return fmt.Sprintf("%.1f %s", f, units[u])
}

// errWriter keeps the first write error so that printing code can ignore them.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}
