//go:build cgo

package gmitest

import (
	"fmt"
	"slices"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// MaxMIGDevices is what the mock answers to GetMaxMigDeviceCount: an A100
// holds at most seven MIG devices.
const MaxMIGDevices = 7

// NewDGXA100 returns go-nvml's mock DGX A100 (MIG mode off on every GPU),
// each GPU extended with MIG device handles.
func NewDGXA100() *dgxa100.Server {
	s := dgxa100.New()
	for _, d := range s.Devices {
		AddMIGDeviceHandles(d.(*dgxa100.Device))
	}
	return s
}

// Device returns GPU i of the mock server.
func Device(s *dgxa100.Server, i int) *dgxa100.Device {
	return s.Devices[i].(*dgxa100.Device)
}

// MIGUUID is the UUID the extended mock gives the MIG device of compute
// instance ci in GPU instance gi of GPU index gpu.
func MIGUUID(gpu, gi, ci int) string {
	return fmt.Sprintf("MIG-%08x-0000-4000-8000-%06x%06x", gpu, gi, ci)
}

// AddMIGDeviceHandles makes d answer GetMaxMigDeviceCount and
// GetMigDeviceHandleByIndex. The MIG devices are d's compute instances,
// ordered by GPU instance ID and compute instance ID; each answers
// GetUUID (MIGUUID), GetGpuInstanceId, GetComputeInstanceId, GetAttributes,
// GetMemoryInfo, IsMigDeviceHandle and GetDeviceHandleFromMigDeviceHandle.
func AddMIGDeviceHandles(d *dgxa100.Device) {
	var mu sync.Mutex
	handles := map[*dgxa100.ComputeInstance]*mock.Device{}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) {
		return MaxMIGDevices, nvml.SUCCESS
	}
	d.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i < 0 || i >= MaxMIGDevices {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		type inst struct {
			gi *dgxa100.GpuInstance
			ci *dgxa100.ComputeInstance
		}
		var list []inst
		d.RLock()
		for gi := range d.GpuInstances {
			gi.RLock()
			for ci := range gi.ComputeInstances {
				list = append(list, inst{gi, ci})
			}
			gi.RUnlock()
		}
		d.RUnlock()
		if i >= len(list) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		slices.SortFunc(list, func(a, b inst) int {
			if a.gi.Info.Id != b.gi.Info.Id {
				return int(a.gi.Info.Id) - int(b.gi.Info.Id)
			}
			return int(a.ci.Info.Id) - int(b.ci.Info.Id)
		})
		mu.Lock()
		defer mu.Unlock()
		it := list[i]
		h, ok := handles[it.ci]
		if !ok {
			h = migDevice(d, it.gi, it.ci)
			handles[it.ci] = h
		}
		return h, nvml.SUCCESS
	}
}

func migDevice(d *dgxa100.Device, gi *dgxa100.GpuInstance, ci *dgxa100.ComputeInstance) *mock.Device {
	giProf := dgxa100.MIGProfiles.GpuInstanceProfiles[int(gi.Info.ProfileId)]
	ciProf := dgxa100.MIGProfiles.ComputeInstanceProfiles[int(gi.Info.ProfileId)][int(ci.Info.ProfileId)]
	uuid := MIGUUID(d.Index, int(gi.Info.Id), int(ci.Info.Id))
	return &mock.Device{
		GetUUIDFunc:              func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
		GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return int(gi.Info.Id), nvml.SUCCESS },
		GetComputeInstanceIdFunc: func() (int, nvml.Return) { return int(ci.Info.Id), nvml.SUCCESS },
		GetAttributesFunc: func() (nvml.DeviceAttributes, nvml.Return) {
			return nvml.DeviceAttributes{
				MultiprocessorCount:       ciProf.MultiprocessorCount,
				GpuInstanceSliceCount:     giProf.SliceCount,
				ComputeInstanceSliceCount: ciProf.SliceCount,
				MemorySizeMB:              giProf.MemorySizeMB,
			}, nvml.SUCCESS
		},
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: giProf.MemorySizeMB << 20}, nvml.SUCCESS
		},
		IsMigDeviceHandleFunc:                  func() (bool, nvml.Return) { return true, nvml.SUCCESS },
		GetDeviceHandleFromMigDeviceHandleFunc: func() (nvml.Device, nvml.Return) { return d, nvml.SUCCESS },
	}
}

// fullCI is the compute instance profile that spans a GPU instance of the
// given slice count.
var fullCI = map[uint32]int{
	1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE,
	2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
	4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
}

// EnableMIG turns MIG mode on for d (through the mock's SetMigMode) and
// creates one GPU instance per profile in giProfiles (nvml.GPU_INSTANCE_PROFILE_*),
// each with one compute instance spanning it.
func EnableMIG(d *dgxa100.Device, giProfiles ...int) error {
	if ret, _ := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		return fmt.Errorf("gmitest: GPU %d: set MIG mode: %v", d.Index, ret)
	}
	for _, p := range giProfiles {
		info, ret := d.GetGpuInstanceProfileInfo(p)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("gmitest: GPU %d: GPU instance profile %d: %v", d.Index, p, ret)
		}
		ci, ok := fullCI[info.SliceCount]
		if !ok {
			return fmt.Errorf("gmitest: GPU %d: no compute instance profile spans %d slices", d.Index, info.SliceCount)
		}
		if err := CreateInstance(d, p, ci, 1); err != nil {
			return err
		}
	}
	return nil
}

// CreateInstance creates, on d, a GPU instance of profile giProfile at its
// first free placement and count compute instances of profile ciProfile in
// it, all through the mock's own calls. MIG mode must be on.
func CreateInstance(d *dgxa100.Device, giProfile, ciProfile, count int) error {
	if cur, _, _ := d.GetMigMode(); cur != nvml.DEVICE_MIG_ENABLE {
		return fmt.Errorf("gmitest: GPU %d: MIG mode is off", d.Index)
	}
	info, ret := d.GetGpuInstanceProfileInfo(giProfile)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("gmitest: GPU %d: GPU instance profile %d: %v", d.Index, giProfile, ret)
	}
	places, ret := d.GetGpuInstancePossiblePlacements(&info)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("gmitest: GPU %d: placements of profile %d: %v", d.Index, giProfile, ret)
	}
	d.RLock()
	var used []nvml.GpuInstancePlacement
	for gi := range d.GpuInstances {
		used = append(used, gi.Info.Placement)
	}
	d.RUnlock()
	free := -1
	for i, pl := range places {
		clash := false
		for _, u := range used {
			if pl.Start < u.Start+u.Size && u.Start < pl.Start+pl.Size {
				clash = true
				break
			}
		}
		if !clash {
			free = i
			break
		}
	}
	if free < 0 {
		return fmt.Errorf("gmitest: GPU %d: no free placement for GPU instance profile %d", d.Index, giProfile)
	}
	gi, ret := d.CreateGpuInstanceWithPlacement(&info, &places[free])
	if ret != nvml.SUCCESS {
		return fmt.Errorf("gmitest: GPU %d: create GPU instance: %v", d.Index, ret)
	}
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciProfile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("gmitest: GPU %d: compute instance profile %d: %v", d.Index, ciProfile, ret)
	}
	if count < 1 || uint32(count) > ciInfo.InstanceCount {
		return fmt.Errorf("gmitest: GPU %d: %d compute instances of profile %d: the GPU instance holds 1 to %d", d.Index, count, ciProfile, ciInfo.InstanceCount)
	}
	for i := 0; i < count; i++ {
		if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
			return fmt.Errorf("gmitest: GPU %d: create compute instance: %v", d.Index, ret)
		}
	}
	return nil
}
