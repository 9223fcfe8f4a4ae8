package gmi

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// mpsDialTimeout bounds the connection attempt to a control socket.
const mpsDialTimeout = time.Second

// ProbeMPS reports whether an MPS control daemon is reachable.
//
// The daemon listens in its pipe directory, CUDA_MPS_PIPE_DIRECTORY or
// /tmp/nvidia-mps, on an entry named "control". ProbeMPS checks that entry
// without sending anything: a named pipe counts as reachable when it has a
// reader (opening it for writing without blocking succeeds; a pipe left
// behind by a dead daemon fails with ENXIO), a UNIX socket when a connection
// to it succeeds. It also records where nvidia-cuda-mps-control is on PATH,
// which says that MPS is installed, not that it runs.
//
// getenv and lookPath default to os.Getenv and exec.LookPath when nil.
func ProbeMPS(ctx context.Context, getenv func(string) string, lookPath func(string) (string, error)) MPS {
	if getenv == nil {
		getenv = os.Getenv
	}
	if lookPath == nil {
		lookPath = defaultLookPath
	}
	m := MPS{PipeDir: getenv(EnvMPSPipeDirectory)}
	if m.PipeDir == "" {
		m.PipeDir = DefaultMPSPipeDirectory
	}
	if p, err := lookPath(MPSControlCommand); err == nil {
		m.Control = p
	}
	path := filepath.Join(m.PipeDir, "control")
	fi, err := os.Lstat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			m.Detail = "no control pipe at " + path
		} else {
			m.Detail = err.Error()
		}
		return m
	}
	switch {
	case fi.Mode()&fs.ModeNamedPipe != 0:
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		switch {
		case err == nil:
			unix.Close(fd)
			m.Running = true
			m.Detail = "control pipe " + path + " has a reader"
		case errors.Is(err, unix.ENXIO):
			m.Detail = "control pipe " + path + " has no reader (left by a daemon that is gone)"
		default:
			m.Detail = "control pipe " + path + ": " + err.Error()
		}
	case fi.Mode()&fs.ModeSocket != 0:
		dctx, cancel := context.WithTimeout(ctx, mpsDialTimeout)
		defer cancel()
		var d net.Dialer
		c, err := d.DialContext(dctx, "unix", path)
		if err != nil {
			m.Detail = "control socket " + path + ": " + err.Error()
			return m
		}
		c.Close()
		m.Running = true
		m.Detail = "control socket " + path + " accepts connections"
	default:
		m.Detail = path + " is neither a pipe nor a socket"
	}
	return m
}
