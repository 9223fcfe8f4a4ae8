package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The launch benchmark times whole commands, such as a launcher starting N
// ranks of /bin/true, against a peer command in the same run:
//
//	gearbench launch -n 21 gearrun -np 4 /bin/true --vs mpirun -np 4 /bin/true
//
// The commands run in turn (one run of each, then the next round), after one
// warm-up run each, with their output discarded; a command that fails stops
// the benchmark. It reports, per command, the median wall time (from just
// before the start to the end of wait) and the median CPU time of the command
// and its descendants that it waited for (user + system, from wait4), and the
// ratio of each median to the last command's.

func benchLaunch(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("launch", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	runs := fs.Int("n", 21, "timed runs of each command (the median is reported)")
	jsonOut := fs.Bool("json", false, "print one JSON object per line")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *runs < 1 {
		return fmt.Errorf("bad -n %d: want at least 1 run", *runs)
	}
	cmds := splitCommands(fs.Args())
	if len(cmds) == 0 {
		return errors.New("no command: usage: gearbench launch [-n RUNS] CMD [ARGS...] [--vs CMD [ARGS...]] (any number of --vs)")
	}
	for _, c := range cmds {
		if len(c) == 0 {
			return errors.New("empty command around --vs")
		}
		if _, err := runTimed(c); err != nil { // warm-up: caches, and a check
			return err
		}
	}
	wall := make([][]float64, len(cmds))
	cpu := make([][]float64, len(cmds))
	for range *runs {
		for i, c := range cmds {
			t, err := runTimed(c)
			if err != nil {
				return err
			}
			wall[i] = append(wall[i], t.wall.Seconds()*1e3)
			cpu[i] = append(cpu[i], t.cpu.Seconds()*1e3)
		}
	}
	peerWall, peerCPU := median(wall[len(cmds)-1]), median(cpu[len(cmds)-1])
	e := emitter{out, *jsonOut}
	for i, c := range cmds {
		w, u := median(wall[i]), median(cpu[i])
		if err := e.emit(kv{"bench", "launch"}, kv{"command", commandLine(c)}, kv{"runs", *runs},
			kv{"wall_ms", w}, kv{"cpu_ms", u}, kv{"wall_ratio", w / peerWall}, kv{"cpu_ratio", u / peerCPU}); err != nil {
			return err
		}
	}
	return nil
}

// commandLine is c as a line of text, with the directories of absolute paths
// dropped (temporary build directories, in the benchmark scripts), except for
// system programs and for arguments that hold spaces (shell commands).
func commandLine(c []string) string {
	out := make([]string, len(c))
	for i, a := range c {
		if filepath.IsAbs(a) && !strings.ContainsAny(a, " \t") && !strings.HasPrefix(a, "/bin/") && !strings.HasPrefix(a, "/usr/") {
			a = filepath.Base(a)
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}

// splitCommands splits args at each "--vs".
func splitCommands(args []string) [][]string {
	if len(args) == 0 {
		return nil
	}
	var cmds [][]string
	cur := []string{}
	for _, a := range args {
		if a == "--vs" {
			cmds = append(cmds, cur)
			cur = []string{}
			continue
		}
		cur = append(cur, a)
	}
	return append(cmds, cur)
}

type timing struct{ wall, cpu time.Duration }

// runTimed runs c with its output discarded and standard input empty.
func runTimed(c []string) (timing, error) {
	cmd := exec.Command(c[0], c[1:]...)
	var stderr strings.Builder
	cmd.Stderr = &limitedWriter{w: &stderr, n: 4096}
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	if err != nil {
		return timing{}, fmt.Errorf("%s: %v\n%s", strings.Join(c, " "), err, stderr.String())
	}
	var u time.Duration
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		u = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	} else {
		u = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	return timing{wall, u}, nil
}

// limitedWriter keeps the first n bytes written to it (a failing command's
// first words) and drops the rest.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	k := min(len(p), l.n)
	if k > 0 {
		l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}
