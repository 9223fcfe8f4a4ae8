package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// programError carries the exit code of a program that cannot be started.
type programError struct {
	err  error
	code int
}

func (e *programError) Error() string { return e.err.Error() }

func (e *programError) Unwrap() error { return e.err }

// startFailed is the error of a rank's program at path, run in dir ("": the
// launcher's), that could not start (os.StartProcess's err): what, then err
// wrapped, with the exit code the reason gives: ExitNotFound,
// ExitNotRunnable, else ExitLaunchFailed. The kernel's ENOENT also stands for
// a missing interpreter on a script's #! line; where that is the reason, the
// error names the interpreter instead of err.
func startFailed(err error, path, dir, what string) *programError {
	code := ExitLaunchFailed
	if errors.Is(err, os.ErrNotExist) {
		code = ExitNotFound
		if interp, ok := missingInterpreter(path, dir); ok {
			return &programError{fmt.Errorf("%s: its #! line names the interpreter %s, which does not exist", what, interp), code}
		}
	} else if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.ENOEXEC) {
		code = ExitNotRunnable
	}
	return &programError{fmt.Errorf("%s: %w", what, err), code}
}

// missingInterpreter reports the interpreter that the #! line of the
// program at path names, when path exists, starts with #! and that
// interpreter does not exist. A relative path is taken in dir, where the
// kernel looks for it.
func missingInterpreter(path, dir string) (string, bool) {
	in := func(p string) string {
		if dir != "" && !filepath.IsAbs(p) {
			return filepath.Join(dir, p)
		}
		return p
	}
	f, err := os.Open(in(path))
	if err != nil {
		return "", false
	}
	defer f.Close()
	head := make([]byte, 256) // what Linux reads of a #! line (BINPRM_BUF_SIZE)
	n, _ := io.ReadFull(f, head)
	line, ok := strings.CutPrefix(string(head[:n]), "#!")
	if !ok {
		return "", false
	}
	line, _, _ = strings.Cut(line, "\n")
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return "", false
	}
	interp := fields[0]
	if _, err := os.Stat(in(interp)); !errors.Is(err, os.ErrNotExist) {
		return "", false
	}
	return interp, true
}

func exitCodeOf(err error) int {
	var pe *programError
	if errors.As(err, &pe) {
		return pe.code
	}
	return ExitLaunchFailed
}

// programs resolves each rank's program once: Go packages are built, names
// without a slash are looked up in PATH.
func (j *job) programs(ctx context.Context) (paths []string, cleanup func(), err error) {
	cleanup = func() {}
	resolved := map[string]string{}
	paths = make([]string, len(j.plan.Ranks))
	var buildDir string
	for i, r := range j.plan.Ranks {
		prog := r.Argv[0]
		if path, ok := resolved[prog]; ok {
			paths[i] = path
			continue
		}
		var path string
		if r.GoPackage {
			if buildDir == "" {
				if buildDir, err = os.MkdirTemp("", "gearrun-build-"); err != nil {
					return nil, cleanup, fmt.Errorf("launch: %w", err)
				}
				dir := buildDir
				cleanup = func() { os.RemoveAll(dir) }
			}
			path, err = BuildGo(ctx, j.inDir(prog), filepath.Join(buildDir, strconv.Itoa(len(resolved))), j.opts.Stderr)
		} else {
			path, err = findProgram(prog, j.plan.Dir)
		}
		if err != nil {
			return nil, cleanup, err
		}
		resolved[prog] = path
		paths[i] = path
	}
	return paths, cleanup, nil
}

func (j *job) inDir(path string) string {
	if j.plan.Dir == "" || filepath.IsAbs(path) {
		return path
	}
	return filepath.Join(j.plan.Dir, path)
}

// findProgram checks that prog can be run: a path (with a slash, relative to dir)
// must be an executable file; a bare name is looked up in PATH.
func findProgram(prog, dir string) (string, error) {
	if !strings.Contains(prog, "/") {
		path, err := exec.LookPath(prog)
		if err != nil {
			return "", &programError{fmt.Errorf("launch: program %q not found in PATH", prog), ExitNotFound}
		}
		return path, nil
	}
	check := prog
	if dir != "" && !filepath.IsAbs(prog) {
		check = filepath.Join(dir, prog)
	}
	fi, err := os.Stat(check)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", &programError{fmt.Errorf("launch: program %s does not exist", prog), ExitNotFound}
	case err != nil:
		return "", &programError{fmt.Errorf("launch: program %s: %w", prog, err), ExitNotRunnable}
	case fi.IsDir():
		return "", &programError{fmt.Errorf("launch: program %s is a directory without Go files", prog), ExitNotRunnable}
	case fi.Mode()&0o111 == 0:
		return "", &programError{fmt.Errorf("launch: program %s is not executable", prog), ExitNotRunnable}
	}
	if dir != "" && !filepath.IsAbs(prog) {
		if abs, err := filepath.Abs(check); err == nil {
			return abs, nil
		}
	}
	return prog, nil
}

// BuildGo builds the Go package in dir into out with `go build` and returns out.
// The compiler's messages go to stderr.
func BuildGo(ctx context.Context, dir, out string, stderr io.Writer) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("launch: %s is a Go package but the go command is not in PATH", dir)
	}
	pkg := dir
	if !filepath.IsAbs(pkg) && !strings.HasPrefix(pkg, ".") {
		pkg = "./" + pkg
	}
	cmd := exec.CommandContext(ctx, goTool, "build", "-o", out, pkg)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("launch: go build %s: %w", dir, err)
	}
	return out, nil
}
