package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gear-rl/gear/cuda/cudatest"
)

func TestBenchGPUWithoutDriver(t *testing.T) {
	t.Setenv("GEAR_CUDA_LIB", filepath.Join(t.TempDir(), "libcuda.so.1"))
	var out bytes.Buffer
	err := benchGPU([]string{"--sizes", "1000"}, &out)
	if err == nil || !strings.HasPrefix(err.Error(), "cuda: no CUDA driver: ") {
		t.Fatalf("got %v, want a no-CUDA-driver error", err)
	}
	if out.Len() != 0 {
		t.Errorf("printed %q before failing", out.String())
	}
}

func TestBenchGPUCPUOnly(t *testing.T) {
	t.Setenv("GEAR_CUDA_LIB", filepath.Join(t.TempDir(), "libcuda.so.1"))
	var out bytes.Buffer
	if err := benchGPU([]string{"--cpu-only", "--json", "--sizes", "5000,20000", "--draws", "64", "--k", "10", "--reps", "2"}, &out); err != nil {
		t.Fatal(err)
	}
	lines := decodeLines(t, out.String())
	if len(lines) != 4 || lines[0]["op"] != "weighted_sample_cpu" || lines[1]["op"] != "topk_cpu" || lines[2]["n"] != 20000.0 {
		t.Fatalf("lines %v", lines)
	}
}

func TestBenchGPUOnFakeDriver(t *testing.T) {
	libs := cudatest.Build(t, cudatest.Options{})
	t.Setenv("GEAR_CUDA_LIB", libs.CUDA)
	var out bytes.Buffer
	err := benchGPU([]string{"--json", "--blocks", "8", "--block-bytes", "4K", "--capacity", "32",
		"--sizes", "20000", "--draws", "64", "--k", "16", "--reps", "2"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	lines := decodeLines(t, out.String())
	var ops []string
	for _, l := range lines {
		ops = append(ops, l["op"].(string))
		if l["bench"] != "gpu" {
			t.Errorf("line %v lacks bench=gpu", l)
		}
	}
	if strings.Join(ops, ",") != "device,pinned_copy,gather,gather_kernel,gather_copies,collect_device,collect_device_copies,weighted_sample,topk" {
		t.Fatalf("ops %v", ops)
	}
	for _, g := range lines[2:5] {
		if g["bytes"] != 8*4096.0 || g["of_pinned_copy"] == nil {
			t.Errorf("%s line %v", g["op"], g)
		}
	}
	for _, g := range lines[5:7] {
		if g["bytes"] != 8*4096.0 || g["blocks"] != 8.0 || g["of_pinned_copy"] == nil || g["wall_of_pinned_copy"] == nil {
			t.Errorf("%s line %v", g["op"], g)
		}
	}
}

func decodeLines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}
