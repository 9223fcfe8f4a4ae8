package gmi

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Where a Topology came from.
const (
	// SourceNVML: the GPUs were read through NVML on this machine.
	SourceNVML = "nvml"
	// SourceFile: a topology file stands in for NVML.
	SourceFile = "file"
	// SourceNone: no GPUs; Topology.Reason says why (no NVML library, no driver).
	SourceNone = "none"
)

// Topology is what a machine offers for GMIs: its GPUs with their MIG
// instances, and whether an MPS control daemon is reachable. It is plain data:
// Discover fills it from NVML or from a topology file, and NewPlan reads it.
type Topology struct {
	// Source is SourceNVML, SourceFile or SourceNone.
	Source string `json:"source"`
	// Path is the topology file when Source is SourceFile.
	Path string `json:"path,omitempty"`
	// Reason says why there are no GPUs when Source is SourceNone.
	Reason string `json:"reason,omitempty"`
	// Driver is the NVIDIA driver version, when known.
	Driver string `json:"driver,omitempty"`
	// GPUs in index order.
	GPUs []GPU `json:"gpus"`
	// MPS is the state of the MPS control daemon.
	MPS MPS `json:"mps"`
}

// GPU is one physical GPU.
type GPU struct {
	// Index is NVML's index (PCI bus order).
	Index int `json:"index"`
	// UUID is "GPU-..."; empty in topology files that leave it out.
	UUID string `json:"uuid,omitempty"`
	// Name is the product name ("NVIDIA A100-SXM4-40GB").
	Name string `json:"name"`
	// Compute is the CUDA compute capability.
	Compute ComputeCapability `json:"compute_capability"`
	// MemoryBytes is the device memory.
	MemoryBytes uint64 `json:"memory_bytes"`
	// MIGMode is whether MIG mode is on now. gear reads it and never changes it.
	MIGMode bool `json:"mig_mode"`
	// MIG lists the MIG instances (one per compute instance), ordered by GPU
	// instance and compute instance ID. Empty unless MIGMode.
	MIG []MIGInstance `json:"mig,omitempty"`
}

// MIGInstance is one MIG device: a compute instance inside a GPU instance,
// the unit a rank binds to with CUDA_VISIBLE_DEVICES.
type MIGInstance struct {
	// UUID is "MIG-..."; empty when NVML listed the instance but gave no
	// MIG device handle for it (the binding then uses the
	// MIG-<GPU UUID>/<GI>/<CI> form).
	UUID string `json:"uuid,omitempty"`
	// Profile is the instance's profile name ("1g.10gb", "1c.2g.10gb").
	Profile string `json:"profile"`
	// GPUInstance and ComputeInstance are the NVML instance IDs.
	GPUInstance     int `json:"gpu_instance"`
	ComputeInstance int `json:"compute_instance"`
	// SMs is the instance's multiprocessor count, when known.
	SMs int `json:"sms,omitempty"`
	// MemoryBytes is the instance's memory, when known.
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
}

// MPS is what the probe found of the MPS control daemon.
type MPS struct {
	// Running is whether a control daemon is reachable through PipeDir.
	Running bool `json:"running"`
	// PipeDir is the pipe directory probed (CUDA_MPS_PIPE_DIRECTORY or its
	// default).
	PipeDir string `json:"pipe_dir,omitempty"`
	// Control is the path of nvidia-cuda-mps-control when it is on PATH.
	Control string `json:"control,omitempty"`
	// Detail says what the probe saw ("control pipe has a reader").
	Detail string `json:"detail,omitempty"`
}

// ComputeCapability is a CUDA compute capability such as 8.0 (sm_80).
type ComputeCapability struct {
	Major, Minor int
}

// SM returns the capability as one number: 80 for 8.0.
func (c ComputeCapability) SM() int { return c.Major*10 + c.Minor }

// String returns "sm_80".
func (c ComputeCapability) String() string { return fmt.Sprintf("sm_%d%d", c.Major, c.Minor) }

// MarshalText writes "8.0", the form topology files and JSON use.
func (c ComputeCapability) MarshalText() ([]byte, error) {
	return []byte(fmt.Sprintf("%d.%d", c.Major, c.Minor)), nil
}

// UnmarshalText reads "8.0" (or "sm_80").
func (c *ComputeCapability) UnmarshalText(b []byte) error {
	cc, err := ParseComputeCapability(string(b))
	if err != nil {
		return err
	}
	*c = cc
	return nil
}

// ParseComputeCapability reads "8.0", "9.0" or "sm_86".
func ParseComputeCapability(s string) (ComputeCapability, error) {
	bad := fmt.Errorf("gmi: compute capability %q: want MAJOR.MINOR such as 8.0, or sm_80", s)
	if rest, ok := strings.CutPrefix(s, "sm_"); ok {
		n, err := strconv.Atoi(rest)
		if !allDigits(rest) || err != nil || n < 10 || n > 999 {
			return ComputeCapability{}, bad
		}
		return ComputeCapability{Major: n / 10, Minor: n % 10}, nil
	}
	maj, min, ok := strings.Cut(s, ".")
	if !ok {
		return ComputeCapability{}, bad
	}
	a, err1 := strconv.Atoi(maj)
	b, err2 := strconv.Atoi(min)
	if !allDigits(maj) || !allDigits(min) || err1 != nil || err2 != nil || a < 1 || a > 99 || b > 9 {
		return ComputeCapability{}, bad
	}
	return ComputeCapability{Major: a, Minor: b}, nil
}

// allDigits reports whether s is a non-empty run of ASCII digits.
func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// GPU returns the GPU with the given index.
func (t *Topology) GPU(index int) (GPU, bool) {
	for _, g := range t.GPUs {
		if g.Index == index {
			return g, true
		}
	}
	return GPU{}, false
}

// describe names a GPU in error messages: "GPU 1 (NVIDIA A100-SXM4-40GB, sm_80)".
func (g GPU) describe() string {
	if g.Name == "" {
		return fmt.Sprintf("GPU %d (%s)", g.Index, g.Compute)
	}
	return fmt.Sprintf("GPU %d (%s, %s)", g.Index, g.Name, g.Compute)
}

// visibleDevice is the CUDA_VISIBLE_DEVICES value that selects MIG instance m
// of GPU g: its MIG UUID, or MIG-<GPU UUID>/<GI>/<CI> when NVML gave none.
func (g GPU) visibleDevice(m MIGInstance) (string, error) {
	if m.UUID != "" {
		return m.UUID, nil
	}
	if g.UUID != "" {
		return fmt.Sprintf("MIG-%s/%d/%d", g.UUID, m.GPUInstance, m.ComputeInstance), nil
	}
	return "", fmt.Errorf("gmi: %s: MIG instance %d/%d (%s) has no UUID and the GPU has none either",
		g.describe(), m.GPUInstance, m.ComputeInstance, m.Profile)
}

// VisibleGPUs reads a CUDA_VISIBLE_DEVICES value against the topology and
// returns the indices of the GPUs it names, in its order: the GPUs a launcher
// that runs under such a restriction (a SLURM allocation, a container) may
// bind. Entries are GPU indices or GPU UUIDs ("GPU-...", or a prefix that
// names one GPU, as CUDA accepts). An empty value means every GPU (nil);
// "NoDevFiles", which SLURM sets for a job without GPUs, means none. Where
// CUDA silently ignores an entry it cannot use and every one after it, gear
// refuses the value: an unknown index or UUID, a MIG instance (gear binds
// MIG instances itself), a GPU named twice.
func (t *Topology) VisibleGPUs(value string) ([]int, error) {
	value = strings.TrimSpace(value)
	switch value {
	case "":
		return nil, nil
	case "NoDevFiles":
		return []int{}, nil
	}
	bad := func(entry, why string) error {
		return fmt.Errorf("gmi: %s=%q: %q %s", EnvCUDAVisibleDevices, value, entry, why)
	}
	out := []int{}
	for _, e := range strings.Split(value, ",") {
		e = strings.TrimSpace(e)
		idx := -1
		switch {
		case strings.HasPrefix(e, "MIG-"):
			return nil, bad(e, "is a MIG instance; gear binds MIG instances itself: name whole GPUs, or unset it")
		case strings.HasPrefix(e, "GPU-"):
			for _, g := range t.GPUs {
				if g.UUID != "" && strings.HasPrefix(g.UUID, e) {
					if idx >= 0 {
						return nil, bad(e, "names more than one GPU")
					}
					idx = g.Index
				}
			}
			if idx < 0 {
				return nil, bad(e, "names no GPU ("+t.DescribeGPUs()+")")
			}
		default:
			n, err := strconv.Atoi(e)
			if err != nil || !allDigits(e) {
				return nil, bad(e, "is neither a GPU index nor a GPU UUID")
			}
			if _, ok := t.GPU(n); !ok {
				return nil, bad(e, "names no GPU ("+t.DescribeGPUs()+")")
			}
			idx = n
		}
		if slices.Contains(out, idx) {
			return nil, bad(e, "names a GPU listed before")
		}
		out = append(out, idx)
	}
	return out, nil
}
