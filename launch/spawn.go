package launch

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/gear-rl/gear/rank"
	"golang.org/x/term"
)

// spawnAll starts every rank; it stops at the first that cannot start.
func (j *job) spawnAll(programs []string, devNull *os.File) error {
	p := j.plan
	var stdin *os.File
	if j.opts.Stdin != nil {
		var err error
		if stdin, err = j.stdinFile(); err != nil {
			return err
		}
	}
	base := j.opts.BaseEnv
	for i := range p.Ranks {
		in := devNull
		if i == 0 && stdin != nil {
			in = stdin
		}
		if err := j.spawn(i, programs[i], in, base); err != nil {
			return err
		}
	}
	if stdin != nil && stdin != j.opts.Stdin {
		stdin.Close() // our copy of rank 0's end of the stdin pipe
	}
	return nil
}

// stdinFile returns the file rank 0 reads: Stdin itself when it is a file that is
// not a terminal, else the read end of a pipe that a goroutine fills.
func (j *job) stdinFile() (*os.File, error) {
	if f, ok := j.opts.Stdin.(*os.File); ok && !term.IsTerminal(int(f.Fd())) {
		return f, nil
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("launch: stdin pipe: %w", err)
	}
	// The copy may stay blocked reading a terminal after the job ends; it holds
	// nothing but pw, and ends at the next line typed or at exit. Each
	// generation has its copy; they read Stdin one after the other.
	go func() {
		j.stdinCopy.Lock()
		io.Copy(pw, j.opts.Stdin)
		j.stdinCopy.Unlock()
		pw.Close()
	}()
	return pr, nil
}

func (j *job) spawn(i int, path string, stdin *os.File, base []string) error {
	r := &j.plan.Ranks[i]
	stdout, stderr, err := j.outputs(i)
	if err != nil {
		return err
	}
	if d := j.plan.inheritDefaults(i); len(d) > 0 {
		base = append(d, base...) // the launcher's own values win
	}
	env := rank.MergeEnv(base, j.plan.Environ(i, j.coord.Addr()), j.plan.inheritDrop(i)...)
	argv := append([]string{r.Argv[0]}, r.Argv[1:]...)
	attr := &os.ProcAttr{
		Dir:   j.plan.Dir,
		Env:   env,
		Files: []*os.File{stdin, stdout, stderr},
		Sys: &syscall.SysProcAttr{
			Setpgid: true,
			// Go's fork checks the race: if the launcher died between fork and
			// prctl, the child kills itself.
			Pdeathsig: syscall.SIGKILL,
		},
	}
	proc, err := os.StartProcess(path, argv, attr)
	stdout.Close() // the child holds its own copies now
	stderr.Close()
	if err != nil {
		return startFailed(err, path, j.plan.Dir, fmt.Sprintf("launch: rank %d: start %s", i, r.Argv[0]))
	}
	j.procs[i] = proc
	j.groups[i] = proc.Pid
	j.guard.add(proc.Pid)
	j.res.Ranks[i].PID = proc.Pid
	j.res.Ranks[i].Started = true
	j.res.Ranks[i].Status = "running"
	j.log.Debug("launch: rank started", "rank", i, "pid", proc.Pid)
	if j.opts.OnStart != nil {
		j.opts.OnStart(i, proc.Pid)
	}
	j.reaper.add(i, proc)
	return nil
}

// outputs returns the write ends a rank gets as stdout and stderr: files in
// OutputDir, or pipes whose read ends feed line pumps.
func (j *job) outputs(i int) (stdout, stderr *os.File, err error) {
	if j.opts.OutputDir != "" {
		if err := os.MkdirAll(j.opts.OutputDir, 0o755); err != nil {
			return nil, nil, fmt.Errorf("launch: output dir: %w", err)
		}
		open := func(stream string) (*os.File, error) {
			name := filepath.Join(j.opts.OutputDir, fmt.Sprintf("rank.%d.%s", i, stream))
			flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
			if j.plan.Restart > 0 {
				flags = os.O_WRONLY | os.O_CREATE | os.O_APPEND // a restarted rank goes on where its predecessor ended
			}
			f, err := os.OpenFile(name, flags, 0o644)
			if err != nil {
				return nil, fmt.Errorf("launch: output dir: %w", err)
			}
			return f, nil
		}
		if stdout, err = open("stdout"); err != nil {
			return nil, nil, err
		}
		if stderr, err = open("stderr"); err != nil {
			stdout.Close()
			return nil, nil, err
		}
		return stdout, stderr, nil
	}
	prefix := ""
	if j.opts.TagOutput {
		prefix = "[" + strconv.Itoa(i) + "] "
	}
	pipe := func(sink *lineSink) (*os.File, error) {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("launch: output pipe: %w", err)
		}
		j.readEnds = append(j.readEnds, r)
		pump := newLinePump(prefix, sink)
		j.pumps.Add(1)
		go func() {
			defer j.pumps.Done()
			pump.run(r)
		}()
		return w, nil
	}
	if stdout, err = pipe(j.stdout); err != nil {
		return nil, nil, err
	}
	if stderr, err = pipe(j.stderr); err != nil {
		stdout.Close()
		return nil, nil, err
	}
	return stdout, stderr, nil
}
