package gmi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The benchmark protocol of the profiling search.
//
// gear runs the benchmark command once per configuration, as one GMI, with
// GEAR_GMI_PER_GPU (K) and GEAR_NUM_ENV set, plus the device binding of one
// MPS share where the machine has one (see ProfileBinding). The program
// prints, on stdout or stderr, a line with throughput=X (its own throughput,
// in its own unit, X > 0) and optionally memory=Y (device memory in bytes);
// several key=value pairs may share a line, separated by spaces or commas,
// and the last value printed wins. A run is not runnable when it exits
// non-zero, outlives its timeout, or prints no positive throughput. When the
// program prints no memory, the peak that a MemorySampler saw is used, and
// failing that the search uses num_env in its place.

// MemorySampler reads the device memory used by a process group.
type MemorySampler interface {
	// Sample returns the bytes of device memory used by the processes of
	// group pgid; false when none of them holds any.
	Sample(pgid int) (uint64, bool)
	// Close releases the sampler.
	Close() error
}

// BenchCommand runs the user's benchmark program; its Profile method is a
// ProfileFunc.
type BenchCommand struct {
	// Args are the program and its arguments.
	Args []string
	// Dir is the working directory; "" means the current one.
	Dir string
	// Env is the base environment; nil means os.Environ().
	Env []string
	// Timeout bounds each run; 0 means only the context does.
	Timeout time.Duration
	// Binding returns extra environment for K GMIs per GPU (the device
	// binding of one GMI); nil adds none.
	Binding func(gmiPerGPU int) map[string]string
	// Memory, when set, is polled every SampleEvery while the program runs.
	Memory      MemorySampler
	SampleEvery time.Duration
	// Output, when set, receives a copy of the program's output.
	Output io.Writer
}

// killGrace is how long a run's output pipes may stay open after the run was
// killed or exited (a grandchild holding them) before gear stops reading.
const killGrace = 2 * time.Second

// Profile runs the benchmark once with K = gmiPerGPU and numEnv environments.
// It returns an error only when ctx ends; a failed run is not runnable. The
// program runs in its own process group, which is killed on timeout or when
// ctx ends.
func (b *BenchCommand) Profile(ctx context.Context, gmiPerGPU, numEnv int) (Measurement, error) {
	if len(b.Args) == 0 {
		return Measurement{}, errors.New("gmi: benchmark: no command")
	}
	runCtx := ctx
	if b.Timeout > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, b.Timeout)
		defer cancel()
	}
	cmd := exec.CommandContext(runCtx, b.Args[0], b.Args[1:]...)
	cmd.Dir = b.Dir
	env := b.Env
	if env == nil {
		env = os.Environ()
	}
	env = append(env[:len(env):len(env)],
		EnvGMIPerGPU+"="+strconv.Itoa(gmiPerGPU),
		EnvNumEnv+"="+strconv.Itoa(numEnv))
	if b.Binding != nil {
		for k, v := range b.Binding(gmiPerGPU) {
			env = append(env, k+"="+v)
		}
	}
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return unix.Kill(-cmd.Process.Pid, unix.SIGKILL) }
	cmd.WaitDelay = killGrace
	out := &metricWriter{tee: b.Output}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return Measurement{Why: "cannot start: " + err.Error()}, nil
	}
	stopSampling := b.sample(cmd.Process.Pid)
	err := cmd.Wait()
	// The group may outlive its leader; it goes with the run.
	_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
	memPeak := stopSampling()
	if ctx.Err() != nil {
		return Measurement{}, ctx.Err()
	}
	top, mem, haveTop, haveMem, last := out.result()
	switch {
	case runCtx.Err() != nil:
		return Measurement{Why: fmt.Sprintf("timed out after %v", b.Timeout)}, nil
	case err != nil:
		why := err.Error()
		if last != "" {
			why += ": " + last
		}
		return Measurement{Why: why}, nil
	case !haveTop:
		return Measurement{Why: "printed no throughput= line"}, nil
	}
	m := Measurement{Runnable: true, Throughput: top}
	switch {
	case haveMem:
		m.Memory = mem
	case memPeak > 0:
		m.Memory = float64(memPeak)
	}
	return m, nil
}

// sample polls the memory sampler for the group until stop is called, which
// waits for the polling goroutine and returns the peak.
func (b *BenchCommand) sample(pgid int) (stop func() uint64) {
	if b.Memory == nil {
		return func() uint64 { return 0 }
	}
	every := b.SampleEvery
	if every <= 0 {
		every = 100 * time.Millisecond
	}
	var peak uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if v, ok := b.Memory.Sample(pgid); ok && v > peak {
				peak = v
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		wg.Wait()
		return peak
	}
}

// metricWriter scans a benchmark's output for throughput= and memory=.
type metricWriter struct {
	mu      sync.Mutex
	tee     io.Writer
	partial []byte
	top     float64
	mem     float64
	haveTop bool
	haveMem bool
	last    string
}

func (w *metricWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.tee != nil {
		w.tee.Write(p)
	}
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.line(string(w.partial[:i]))
		w.partial = w.partial[i+1:]
	}
	return len(p), nil
}

func (w *metricWriter) line(s string) {
	s = strings.TrimSpace(s)
	if s == "" {
		return
	}
	metric := false
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == '\t' || r == ',' }) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(x) || math.IsInf(x, 0) || x < 0 {
			continue
		}
		switch k {
		case "throughput":
			w.top, w.haveTop, metric = x, true, true
		case "memory":
			w.mem, w.haveMem, metric = x, true, true
		}
	}
	if !metric {
		w.last = s
		if len(w.last) > 200 {
			w.last = w.last[:200] + "..."
		}
	}
}

func (w *metricWriter) result() (top, mem float64, haveTop, haveMem bool, last string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.partial) > 0 {
		w.line(string(w.partial))
		w.partial = nil
	}
	return w.top, w.mem, w.haveTop, w.haveMem, w.last
}

// ProfileBinding returns the device binding of one GMI for the profiling
// search on GPU index gpu of t: CUDA_VISIBLE_DEVICES, and with K > 1 and a
// reachable MPS daemon, the MPS share 100/K. It returns nil when t has no
// such GPU, or when the GPU is in MIG mode (its instances are fixed, so K
// cannot be varied there).
func ProfileBinding(t *Topology, gpu int) func(gmiPerGPU int) map[string]string {
	g, ok := t.GPU(gpu)
	if !ok || g.MIGMode {
		return nil
	}
	return func(k int) map[string]string {
		env := map[string]string{
			EnvCUDAVisibleDevices: strconv.Itoa(g.Index),
			EnvCUDADeviceOrder:    "PCI_BUS_ID",
		}
		if k > 1 && t.MPS.Running && g.Compute.SM() >= 70 {
			env[EnvMPSThreadPercent] = strconv.Itoa(100 / k)
		}
		return env
	}
}
