package gmi

import (
	"context"
	"os"
	"os/exec"
)

// DiscoverOption adjusts Discover.
type DiscoverOption func(*discoverConfig)

type discoverConfig struct {
	file     string
	fileSet  bool
	getenv   func(string) string
	lookPath func(string) (string, error)
	nvml     any // an nvml.Interface (see WithNVML); any so this file builds without cgo
}

// WithTopologyFile reads the machine from a topology file instead of NVML,
// whatever GEAR_TOPOLOGY says. An empty path means NVML even when
// GEAR_TOPOLOGY is set.
func WithTopologyFile(path string) DiscoverOption {
	return func(c *discoverConfig) { c.file, c.fileSet = path, true }
}

// WithGetenv replaces os.Getenv for GEAR_TOPOLOGY and CUDA_MPS_PIPE_DIRECTORY.
func WithGetenv(getenv func(string) string) DiscoverOption {
	return func(c *discoverConfig) { c.getenv = getenv }
}

// WithLookPath replaces exec.LookPath for finding nvidia-cuda-mps-control.
func WithLookPath(lookPath func(string) (string, error)) DiscoverOption {
	return func(c *discoverConfig) { c.lookPath = lookPath }
}

// Discover returns this machine's topology.
//
// With a topology file (WithTopologyFile, else GEAR_TOPOLOGY) it reads the
// file, MPS state included. Otherwise it reads the GPUs through NVML and
// probes the MPS control daemon (ProbeMPS). A machine without the NVML
// library or driver, and a binary built without cgo, have no GPUs: the
// topology's Source is SourceNone and Reason says why; that is not an error.
// Errors are a bad topology file, or NVML failing after it started.
func Discover(ctx context.Context, opts ...DiscoverOption) (*Topology, error) {
	cfg := discoverConfig{getenv: os.Getenv, lookPath: defaultLookPath}
	for _, o := range opts {
		o(&cfg)
	}
	path := cfg.file
	if !cfg.fileSet {
		path = cfg.getenv(EnvTopology)
	}
	if path != "" {
		return LoadTopology(path)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t, err := readNVML(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	t.MPS = ProbeMPS(ctx, cfg.getenv, cfg.lookPath)
	return t, nil
}

func defaultLookPath(name string) (string, error) { return exec.LookPath(name) }
