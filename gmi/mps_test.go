package gmi

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func probeIn(t *testing.T, dir string) MPS {
	t.Helper()
	getenv := func(k string) string {
		if k == EnvMPSPipeDirectory {
			return dir
		}
		return ""
	}
	lookPath := func(name string) (string, error) {
		if name == MPSControlCommand {
			return "/usr/bin/" + name, nil
		}
		return "", errors.New("not found")
	}
	return ProbeMPS(context.Background(), getenv, lookPath)
}

func TestProbeMPSNamedPipe(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "control")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// No reader: the pipe of a daemon that is gone.
	m := probeIn(t, dir)
	if m.Running || !strings.Contains(m.Detail, "no reader") || m.PipeDir != dir || m.Control != "/usr/bin/nvidia-cuda-mps-control" {
		t.Errorf("stale pipe: %+v", m)
	}
	// A reader, as the daemon holds it.
	fd, err := unix.Open(fifo, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	m = probeIn(t, dir)
	if !m.Running || !strings.Contains(m.Detail, "has a reader") {
		t.Errorf("live pipe: %+v", m)
	}
}

func TestProbeMPSSocket(t *testing.T) {
	dir := t.TempDir()
	l, err := net.Listen("unix", filepath.Join(dir, "control"))
	if err != nil {
		t.Fatal(err)
	}
	m := probeIn(t, dir)
	if !m.Running || !strings.Contains(m.Detail, "accepts connections") {
		t.Errorf("live socket: %+v", m)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	m = probeIn(t, dir)
	if m.Running || !strings.Contains(m.Detail, "control socket") {
		t.Errorf("closed socket: %+v", m)
	}
}

func TestProbeMPSAbsent(t *testing.T) {
	dir := t.TempDir()
	m := probeIn(t, dir)
	if m.Running || !strings.Contains(m.Detail, "no control pipe") {
		t.Errorf("empty dir: %+v", m)
	}
	if err := os.WriteFile(filepath.Join(dir, "control"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	m = probeIn(t, dir)
	if m.Running || !strings.Contains(m.Detail, "neither a pipe nor a socket") {
		t.Errorf("plain file: %+v", m)
	}
	def := ProbeMPS(context.Background(), func(string) string { return "" }, func(string) (string, error) { return "", errors.New("no") })
	if def.PipeDir != DefaultMPSPipeDirectory || def.Control != "" {
		t.Errorf("defaults: %+v", def)
	}
}
