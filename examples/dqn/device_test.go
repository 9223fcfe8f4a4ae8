package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/gear-rl/gear/cuda/cudatest"
)

// --device gpu on the fake driver (its kernels run on the CPU) trains as
// --device cpu does: with the same seed the two runs play the same episodes,
// since the learners agree to about 1e-7.
func TestDeviceGPUOnFakeFollowsCPU(t *testing.T) {
	libs := cudatest.Build(t, cudatest.Options{})
	t.Setenv("GEAR_CUDA_LIB", libs.CUDA)
	args := []string{"--quick", "--seed", "3", "--frames", "900", "--learning-starts", "300", "--hidden", "32,32", "--report-every", "1h"}
	episodes := regexp.MustCompile(`(\d+) episodes, 900 frames, (\d+) gradient steps`)
	var got [2][]string
	for i, device := range []string{"cpu", "gpu"} {
		var out, errb bytes.Buffer
		code := run(append(args, "--device", device, "--batches", "host"), &out, &errb)
		t.Logf("--device %s: %s", device, strings.TrimSpace(out.String()))
		if code != 1 { // 900 frames do not solve
			t.Fatalf("--device %s: exit %d, want 1; stderr: %s", device, code, errb.String())
		}
		if device == "gpu" && !strings.Contains(out.String(), "learner on gpu 0 (Fake GPU 0") {
			t.Fatalf("--device gpu did not use the fake GPU: %q", out.String())
		}
		if got[i] = episodes.FindStringSubmatch(out.String()); got[i] == nil {
			t.Fatalf("--device %s: no summary in %q", device, out.String())
		}
	}
	if got[0][1] != got[1][1] || got[0][2] != got[1][2] {
		t.Errorf("cpu: %s episodes, %s gradient steps; gpu: %s, %s", got[0][1], got[0][2], got[1][1], got[1][2])
	}
}

func TestDeviceFlag(t *testing.T) {
	t.Setenv("GEAR_CUDA_LIB", "/nonexistent/libcuda.so.1")
	var out, errb bytes.Buffer
	if code := run([]string{"--quick", "--device", "gpu"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "no CUDA driver") {
		t.Errorf("--device gpu without a driver: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"--quick", "--device", "tpu"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `--device "tpu"`) {
		t.Errorf("--device tpu: exit %d, stderr %q", code, errb.String())
	}
	out.Reset()
	if code := run([]string{"--quick", "--device", "auto", "--frames", "50", "--report-every", "1h"}, &out, &errb); code != 1 || !strings.Contains(out.String(), "learner on cpu") {
		t.Errorf("--device auto without a driver: exit %d, out %q, stderr %q", code, out.String(), errb.String())
	}
}

// --device gpu with the GEAR batch path (the default) on the fake driver: the
// run samples on the device, gathers from the registered shard and learns.
func TestDeviceGPUBatchesOnFake(t *testing.T) {
	libs := cudatest.Build(t, cudatest.Options{})
	t.Setenv("GEAR_CUDA_LIB", libs.CUDA)
	var out, errb bytes.Buffer
	code := run([]string{"--quick", "--seed", "3", "--frames", "700", "--learning-starts", "300", "--hidden", "32,32", "--report-every", "1h", "--device", "gpu"}, &out, &errb)
	t.Log(strings.TrimSpace(out.String()))
	if code != 1 || !strings.Contains(out.String(), "gathered zero-copy") || !strings.Contains(out.String(), "401 gradient steps") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}
