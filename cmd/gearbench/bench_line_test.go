package main

import (
	"bytes"
	"errors"
	"testing"

	"github.com/gear-rl/gear/internal/cpuline"
)

func TestBenchLine(t *testing.T) {
	var out bytes.Buffer
	err := benchLine([]string{"--json", "--rounds", "1001", "--trials", "2"}, &out)
	if errors.Is(err, cpuline.ErrOneCPU) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	lines := sampleLines(t, out.String())
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 2 trials and the median:\n%s", len(lines), out.String())
	}
	var ns []float64
	for i, l := range lines[:2] {
		if l["bench"] != "line" || l["trial"] != float64(i+1) || l["rounds"] != 998.0 || l["ns_per_line"].(float64) <= 0 {
			t.Errorf("line %v", l)
		}
		ns = append(ns, l["ns_per_line"].(float64))
	}
	if m := lines[2]["median_ns_per_line"]; m != median(ns) {
		t.Errorf("median %v, want %v", m, median(ns))
	}
	for _, bad := range [][]string{{"--trials", "0"}, {"--rounds", "3"}, {"--nope"}} {
		if err := benchLine(bad, &out); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}
