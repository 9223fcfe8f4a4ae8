package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gear-rl/gear/cuda/cudatest"
)

func TestBenchLearnerCPU(t *testing.T) {
	var out bytes.Buffer
	if err := benchLearner([]string{"--json", "--hidden", "16", "--batch", "8", "--steps", "4", "--capacity", "100", "--actors", "2", "--frames-per-step", "3"}, &out); err != nil {
		t.Fatal(err)
	}
	lines := decodeLines(t, out.String())
	if len(lines) != 2 || lines[0]["op"] != "gradient_steps" || lines[0]["device"] != "cpu" || lines[0]["network"] != "[4 16 16 2]" ||
		lines[1]["op"] != "frames" || lines[1]["frames"] != 24.0 {
		t.Fatalf("lines %v", lines)
	}
	if v, ok := lines[0]["steps_per_s"].(float64); !ok || v <= 0 {
		t.Fatalf("steps_per_s %v", lines[0]["steps_per_s"])
	}
}

func TestBenchLearnerOnFakeDriver(t *testing.T) {
	libs := cudatest.Build(t, cudatest.Options{})
	t.Setenv("GEAR_CUDA_LIB", libs.CUDA)
	var out bytes.Buffer
	if err := benchLearner([]string{"--json", "--device", "gpu", "--hidden", "16,8", "--batch", "8", "--steps", "3", "--capacity", "100", "--actors", "1", "--frames-per-step", "2"}, &out); err != nil {
		t.Fatal(err)
	}
	lines := decodeLines(t, out.String())
	if len(lines) != 2 || !strings.HasPrefix(lines[0]["device"].(string), "gpu 0 (Fake GPU 0") || lines[0]["network"] != "[4 16 8 2]" || lines[1]["frames"] != 6.0 {
		t.Fatalf("lines %v", lines)
	}
}

func TestBenchLearnerGPUWithoutDriver(t *testing.T) {
	t.Setenv("GEAR_CUDA_LIB", filepath.Join(t.TempDir(), "libcuda.so.1"))
	var out bytes.Buffer
	err := benchLearner([]string{"--device", "gpu", "--hidden", "8", "--batch", "4", "--steps", "1"}, &out)
	if err == nil || !strings.HasPrefix(err.Error(), "cuda: no CUDA driver: ") {
		t.Fatalf("got %v, want a no-CUDA-driver error", err)
	}
}
