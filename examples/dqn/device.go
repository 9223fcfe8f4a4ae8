package main

import (
	"errors"
	"fmt"

	"math/rand/v2"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/examples/dqn/gpulearn"
)

// learnerDevice is where the learner runs: the CPU (dev nil) or a GPU.
type learnerDevice struct {
	dev  *cuda.Device
	name string
}

// openDevice resolves --device: "cpu"; "gpu", device 0 of the CUDA driver
// (GEAR_CUDA_LIB, else libcuda.so.1), an error without one; "auto", the GPU
// when a driver opens with a device, else the CPU.
func openDevice(mode string) (*learnerDevice, error) {
	switch mode {
	case "cpu":
		return &learnerDevice{name: "cpu"}, nil
	case "gpu", "auto":
	default:
		return nil, fmt.Errorf("dqn: --device %q: want cpu, gpu or auto", mode)
	}
	drv, err := cuda.OpenDriver()
	if err == nil {
		var n int
		if n, err = drv.DeviceCount(); err == nil && n == 0 {
			err = fmt.Errorf("%w: no device", cuda.ErrNoDriver)
		}
	}
	if err != nil {
		if mode == "auto" && errors.Is(err, cuda.ErrNoDriver) {
			return &learnerDevice{name: "cpu"}, nil
		}
		return nil, fmt.Errorf("dqn: --device %s: %w", mode, err)
	}
	dev, err := drv.Device(0)
	if err != nil {
		return nil, fmt.Errorf("dqn: --device %s: %w", mode, err)
	}
	name, _ := dev.Name()
	return &learnerDevice{dev: dev, name: "gpu 0 (" + name + ")"}, nil
}

// newLearner is agent.RunConfig's NewLearner for the device: nil for the CPU.
func (d *learnerDevice) newLearner() func(agent.Config, int, int, *rand.Rand) (agent.Learner, error) {
	if d.dev == nil {
		return nil
	}
	return gpulearn.Opener(d.dev)
}

// newReplay is agent.RunConfig's NewDeviceReplay: the GEAR batch path on the
// GPU unless replayMode is "host", nil on the CPU.
func (d *learnerDevice) newReplay(replayMode string) func(agent.Learner, agent.Config, *rand.Rand) (agent.DeviceReplay, error) {
	if d.dev == nil || replayMode == "host" {
		return nil
	}
	return gpulearn.ReplayOpener()
}

// Close releases the GPU, after the learner has been closed.
func (d *learnerDevice) Close() error {
	if d.dev == nil {
		return nil
	}
	return d.dev.Close()
}
