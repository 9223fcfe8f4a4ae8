//go:build cgo

package gmi

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sys/unix"
)

// WithNVML makes Discover read the GPUs from lib instead of the system's NVML
// library: go-nvml's mocks (pkg/nvml/mock/dgxa100), or a library opened at a
// non-default path with nvml.New(nvml.WithLibraryPath(...)).
func WithNVML(lib nvml.Interface) DiscoverOption {
	return func(c *discoverConfig) { c.nvml = lib }
}

func readNVML(ctx context.Context, cfg *discoverConfig) (*Topology, error) {
	lib, _ := cfg.nvml.(nvml.Interface)
	if lib == nil {
		lib = nvml.New()
	}
	return ReadNVML(ctx, lib)
}

// ReadNVML reads the GPUs and their MIG instances through lib; it does not
// probe MPS (Discover does). It initializes lib and shuts it down before
// returning. When lib cannot start (no libnvidia-ml.so, no driver), the
// topology has no GPUs, Source SourceNone and the reason, and no error.
//
// MIG instances come from two NVML views, merged by (GPU instance, compute
// instance) ID: the GPU and compute instances with their profiles, and the
// MIG device handles with their UUIDs. A driver that refuses the first view
// to an unprivileged user still gives the second, whose attributes name the
// profile.
func ReadNVML(ctx context.Context, lib nvml.Interface) (*Topology, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return &Topology{Source: SourceNone, Reason: "NVML: " + ret.Error(), GPUs: []GPU{}}, nil
	}
	defer lib.Shutdown()
	t := &Topology{Source: SourceNVML, GPUs: []GPU{}}
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		t.Driver = v
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("gmi: nvml: device count: %v", ret)
	}
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("gmi: nvml: GPU %d: handle: %v", i, ret)
		}
		g, err := readGPU(dev, i)
		if err != nil {
			return nil, err
		}
		t.GPUs = append(t.GPUs, g)
	}
	return t, nil
}

func readGPU(dev nvml.Device, i int) (GPU, error) {
	g := GPU{Index: i}
	fail := func(what string, ret nvml.Return) (GPU, error) {
		return GPU{}, fmt.Errorf("gmi: nvml: GPU %d: %s: %v", i, what, ret)
	}
	var ret nvml.Return
	if g.Index, ret = dev.GetIndex(); ret != nvml.SUCCESS {
		return fail("index", ret)
	}
	if g.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
		return fail("UUID", ret)
	}
	if g.Name, ret = dev.GetName(); ret != nvml.SUCCESS {
		return fail("name", ret)
	}
	if g.Compute.Major, g.Compute.Minor, ret = dev.GetCudaComputeCapability(); ret != nvml.SUCCESS {
		return fail("compute capability", ret)
	}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return fail("memory", ret)
	}
	g.MemoryBytes = mem.Total
	// GPUs without MIG answer ERROR_NOT_SUPPORTED: MIG mode off.
	if cur, _, ret := dev.GetMigMode(); ret == nvml.SUCCESS && cur == nvml.DEVICE_MIG_ENABLE {
		g.MIGMode = true
		m, err := readMIG(dev, g)
		if err != nil {
			return GPU{}, err
		}
		g.MIG = m
	}
	return g, nil
}

type migKey struct{ gi, ci int }

func readMIG(dev nvml.Device, g GPU) ([]MIGInstance, error) {
	found := map[migKey]*MIGInstance{}
	var order []migKey
	add := func(k migKey) *MIGInstance {
		if m, ok := found[k]; ok {
			return m
		}
		m := &MIGInstance{GPUInstance: k.gi, ComputeInstance: k.ci}
		found[k] = m
		order = append(order, k)
		return m
	}

	// View 1: GPU instances by profile, compute instances by profile.
profiles:
	for p := 0; p < nvml.GPU_INSTANCE_PROFILE_COUNT; p++ {
		info, ret := dev.GetGpuInstanceProfileInfo(p)
		if ret != nvml.SUCCESS {
			continue // profile not offered by this GPU
		}
		gis, ret := dev.GetGpuInstances(&info)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NO_PERMISSION:
			break profiles // view 2 still gives every instance
		default:
			continue
		}
		for _, gi := range gis {
			giInfo, ret := gi.GetInfo()
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("gmi: nvml: GPU %d: GPU instance info: %v", g.Index, ret)
			}
			for cp := 0; cp < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; cp++ {
				ciProf, ret := gi.GetComputeInstanceProfileInfo(cp, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
				if ret != nvml.SUCCESS {
					continue
				}
				cis, ret := gi.GetComputeInstances(&ciProf)
				if ret != nvml.SUCCESS {
					continue
				}
				for _, ci := range cis {
					ciInfo, ret := ci.GetInfo()
					if ret != nvml.SUCCESS {
						return nil, fmt.Errorf("gmi: nvml: GPU %d: compute instance info: %v", g.Index, ret)
					}
					m := add(migKey{int(giInfo.Id), int(ciInfo.Id)})
					m.Profile = migProfileName(info.SliceCount, ciProf.SliceCount, info.MemorySizeMB, g.MemoryBytes, migAttrs(int(info.Id)))
					m.SMs = int(ciProf.MultiprocessorCount)
					m.MemoryBytes = info.MemorySizeMB << 20
				}
			}
		}
	}

	// View 2: MIG device handles, which carry the UUIDs.
	maxMIG, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("gmi: nvml: GPU %d: MIG device count: %v", g.Index, ret)
	}
	for i := 0; i < maxMIG; i++ {
		h, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("gmi: nvml: GPU %d: MIG device %d: %v", g.Index, i, ret)
		}
		gi, ret1 := h.GetGpuInstanceId()
		ci, ret2 := h.GetComputeInstanceId()
		uuid, ret3 := h.GetUUID()
		for _, r := range []nvml.Return{ret1, ret2, ret3} {
			if r != nvml.SUCCESS {
				return nil, fmt.Errorf("gmi: nvml: GPU %d: MIG device %d: %v", g.Index, i, r)
			}
		}
		m := add(migKey{gi, ci})
		m.UUID = uuid
		if m.Profile != "" {
			continue
		}
		if a, ret := h.GetAttributes(); ret == nvml.SUCCESS {
			m.Profile = migProfileName(a.GpuInstanceSliceCount, a.ComputeInstanceSliceCount, a.MemorySizeMB, g.MemoryBytes, "")
			m.SMs = int(a.MultiprocessorCount)
			m.MemoryBytes = a.MemorySizeMB << 20
		} else if mem, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
			m.MemoryBytes = mem.Total
		}
	}
	out := make([]MIGInstance, 0, len(order))
	for _, k := range order {
		out = append(out, *found[k])
	}
	sortMIG(out)
	return out, nil
}

// migAttrs is the profile-name suffix of a GPU instance profile.
func migAttrs(profileID int) string {
	switch profileID {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:
		return "+me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME:
		return "+me.all"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:
		return "-me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX,
		nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:
		return "+gfx"
	}
	return ""
}

// OpenMemorySampler opens the system's NVML library to read the device
// memory of benchmark runs. It fails where NVML does not start.
func OpenMemorySampler() (MemorySampler, error) {
	return NewNVMLMemorySampler(nvml.New())
}

// NewNVMLMemorySampler reads process memory through lib, which it
// initializes; Close shuts it down.
func NewNVMLMemorySampler(lib nvml.Interface) (MemorySampler, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("gmi: nvml: %v", ret)
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		lib.Shutdown()
		return nil, fmt.Errorf("gmi: nvml: device count: %v", ret)
	}
	s := &nvmlSampler{lib: lib, pgidOf: unix.Getpgid}
	for i := 0; i < n; i++ {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			lib.Shutdown()
			return nil, fmt.Errorf("gmi: nvml: GPU %d: handle: %v", i, ret)
		}
		s.devs = append(s.devs, d)
	}
	return s, nil
}

type nvmlSampler struct {
	lib    nvml.Interface
	devs   []nvml.Device
	pgidOf func(pid int) (int, error)
	once   sync.Once
}

// Sample sums the memory that NVML reports for the group's processes, both
// as plain CUDA processes and as MPS clients.
func (s *nvmlSampler) Sample(pgid int) (uint64, bool) {
	var total uint64
	found := false
	for _, d := range s.devs {
		for _, list := range []func() ([]nvml.ProcessInfo, nvml.Return){d.GetComputeRunningProcesses, d.GetMPSComputeRunningProcesses} {
			procs, ret := list()
			if ret != nvml.SUCCESS {
				continue
			}
			for _, p := range procs {
				if p.UsedGpuMemory == math.MaxUint64 {
					continue // NVML_VALUE_NOT_AVAILABLE
				}
				if g, err := s.pgidOf(int(p.Pid)); err == nil && g == pgid {
					total += p.UsedGpuMemory
					found = true
				}
			}
		}
	}
	return total, found
}

func (s *nvmlSampler) Close() error {
	s.once.Do(func() { s.lib.Shutdown() })
	return nil
}
