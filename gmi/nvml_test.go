//go:build cgo

package gmi

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/gmi/gmitest"
)

func discoverMock(t *testing.T, lib nvml.Interface) *Topology {
	t.Helper()
	topo, err := Discover(context.Background(), WithNVML(lib), WithTopologyFile(""),
		WithGetenv(func(string) string { return "" }),
		WithLookPath(func(string) (string, error) { return "", os.ErrNotExist }))
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

// go-nvml's DGX A100, untouched: eight A100s with MIG mode off.
func TestDiscoverDGXA100(t *testing.T) {
	server := dgxa100.New()
	topo := discoverMock(t, server)
	if topo.Source != SourceNVML || topo.Driver != "550.54.15" || len(topo.GPUs) != 8 {
		t.Fatalf("topology %+v", topo)
	}
	for i, g := range topo.GPUs {
		d := server.Devices[i].(*dgxa100.Device)
		if g.Index != i || g.UUID != d.UUID || !strings.HasPrefix(g.UUID, "GPU-") || g.Name != "Mock NVIDIA A100-SXM4-40GB" ||
			g.Compute != (ComputeCapability{8, 0}) || g.MemoryBytes != 40<<30 || g.MIGMode || len(g.MIG) != 0 {
			t.Errorf("GPU %d: %+v", i, g)
		}
	}
	if topo.MPS.Running {
		t.Errorf("MPS %+v", topo.MPS)
	}
	// A plan on the mock: 8 GPUs x 2 GMIs, MPS backend.
	p, err := NewPlan(topo, PlanRequest{Ranks: 16, GMIPerGPU: 2})
	if err != nil || p.Backend != BackendMPS || p.Strategy != MultiRing {
		t.Fatalf("plan %+v, %v", p, err)
	}
}

// MIG instances made through the mock's own calls, as nvidia-smi would name
// them.
func TestDiscoverDGXA100MIG(t *testing.T) {
	server := gmitest.NewDGXA100()
	d0, d1, d2 := gmitest.Device(server, 0), gmitest.Device(server, 1), gmitest.Device(server, 2)
	// 2g first: then 3g takes the upper half and both 1g fit (first free placement).
	if err := gmitest.EnableMIG(d0, nvml.GPU_INSTANCE_PROFILE_2_SLICE, nvml.GPU_INSTANCE_PROFILE_3_SLICE,
		nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1); err != nil {
		t.Fatal(err)
	}
	if err := gmitest.EnableMIG(d1); err != nil {
		t.Fatal(err)
	}
	// A 2g GPU instance split into two 1-slice compute instances, and a 1g.10gb.
	if err := gmitest.CreateInstance(d1, nvml.GPU_INSTANCE_PROFILE_2_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2); err != nil {
		t.Fatal(err)
	}
	if err := gmitest.CreateInstance(d1, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 1); err != nil {
		t.Fatal(err)
	}
	// MIG mode on, no instances yet.
	if err := gmitest.EnableMIG(d2); err != nil {
		t.Fatal(err)
	}
	topo := discoverMock(t, server)
	type inst struct {
		profile string
		gi, ci  int
		sms     int
		mib     uint64
	}
	want := map[int][]inst{
		0: {{"2g.10gb", 0, 0, 28, 9856}, {"3g.20gb", 1, 0, 42, 19968}, {"1g.5gb", 2, 0, 14, 4864}, {"1g.5gb+me", 3, 0, 14, 4864}},
		1: {{"1c.2g.10gb", 0, 0, 14, 9856}, {"1c.2g.10gb", 0, 1, 14, 9856}, {"1g.10gb", 1, 0, 14, 9856}},
		2: {},
	}
	for idx, insts := range want {
		g := topo.GPUs[idx]
		if !g.MIGMode || len(g.MIG) != len(insts) {
			t.Errorf("GPU %d: MIG %v, %d instances %+v, want %d", idx, g.MIGMode, len(g.MIG), g.MIG, len(insts))
			continue
		}
		for i, w := range insts {
			m := g.MIG[i]
			if m.Profile != w.profile || m.GPUInstance != w.gi || m.ComputeInstance != w.ci || m.SMs != w.sms ||
				m.MemoryBytes != w.mib<<20 || m.UUID != gmitest.MIGUUID(idx, w.gi, w.ci) {
				t.Errorf("GPU %d instance %d: %+v, want %+v", idx, i, m, w)
			}
		}
	}
	if topo.GPUs[3].MIGMode {
		t.Error("GPU 3: MIG mode on")
	}
	// GPU 0's four instances host four ranks over MIG; two GPUs hold 4+3.
	p, err := NewPlan(topo, PlanRequest{Ranks: 7, GMIPerGPU: 4, Workload: Serving})
	if err != nil {
		t.Fatal(err)
	}
	if p.Backend != BackendMIG || p.Mapping.String() != "[[0,1,2,3],[4,5,6]]" || p.Strategy != Hierarchical {
		t.Errorf("plan %s %s %s", p.Backend, p.Mapping, p.Strategy)
	}
	if got := p.Bindings[5].Env[EnvCUDAVisibleDevices]; got != gmitest.MIGUUID(1, 0, 1) {
		t.Errorf("rank 5 bound to %s", got)
	}
	_, err = NewPlan(topo, PlanRequest{Ranks: 1, GPUs: []int{2}})
	if err == nil || !strings.Contains(err.Error(), "has 0 MIG instances (none)") {
		t.Errorf("GPU without instances: %v", err)
	}
}

// Without privileges a driver refuses the GPU-instance view; the MIG device
// handles still give every instance, named from their attributes.
func TestDiscoverMIGUnprivileged(t *testing.T) {
	server := gmitest.NewDGXA100()
	d := gmitest.Device(server, 4)
	if err := gmitest.EnableMIG(d, nvml.GPU_INSTANCE_PROFILE_3_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE); err != nil {
		t.Fatal(err)
	}
	d.GetGpuInstancesFunc = func(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
		return nil, nvml.ERROR_NO_PERMISSION
	}
	topo := discoverMock(t, server)
	g := topo.GPUs[4]
	if len(g.MIG) != 2 || g.MIG[0].Profile != "3g.20gb" || g.MIG[1].Profile != "1g.5gb" || g.MIG[1].UUID != gmitest.MIGUUID(4, 1, 0) || g.MIG[0].SMs != 42 {
		t.Errorf("MIG %+v", g.MIG)
	}
}

func TestDiscoverWithoutNVMLIsNoGPUs(t *testing.T) {
	lib := nvml.New(nvml.WithLibraryPath(filepath.Join(t.TempDir(), "libnvidia-ml.so.1")))
	topo := discoverMock(t, lib)
	if topo.Source != SourceNone || len(topo.GPUs) != 0 || !strings.Contains(topo.Reason, "NVML") {
		t.Errorf("topology %+v", topo)
	}
	_, err := NewPlan(topo, PlanRequest{Ranks: 1})
	if err == nil || !strings.Contains(err.Error(), "no GPUs (NVML: ") {
		t.Errorf("plan without GPUs: %v", err)
	}
}

func TestDiscoverNVMLFailure(t *testing.T) {
	server := dgxa100.New()
	server.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	_, err := Discover(context.Background(), WithNVML(server), WithTopologyFile(""))
	if err == nil || !strings.HasPrefix(err.Error(), "gmi: nvml: device count") {
		t.Errorf("error %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Discover(ctx, WithNVML(dgxa100.New()), WithTopologyFile("")); err != context.Canceled {
		t.Errorf("cancelled: %v", err)
	}
}

func TestNVMLMemorySampler(t *testing.T) {
	server := dgxa100.New()
	me := os.Getpid()
	pgid, err := unix.Getpgid(me)
	if err != nil {
		t.Fatal(err)
	}
	for i, dev := range server.Devices {
		d := dev.(*dgxa100.Device)
		procs := []nvml.ProcessInfo{{Pid: 1, UsedGpuMemory: 1 << 40}}
		if i == 2 {
			procs = append(procs, nvml.ProcessInfo{Pid: uint32(me), UsedGpuMemory: 3 << 30})
		}
		d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return procs, nvml.SUCCESS }
		d.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			if i == 5 {
				return []nvml.ProcessInfo{{Pid: uint32(me), UsedGpuMemory: 1 << 30}, {Pid: uint32(me), UsedGpuMemory: ^uint64(0)}}, nvml.SUCCESS
			}
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
	}
	s, err := NewNVMLMemorySampler(server)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, ok := s.Sample(pgid); !ok || got != 4<<30 {
		t.Errorf("Sample(own group) = %d, %v; want 4 GiB", got, ok)
	}
	if pgid != 1 {
		if got, ok := s.Sample(-5); ok {
			t.Errorf("Sample(no group) = %d", got)
		}
	}
}
