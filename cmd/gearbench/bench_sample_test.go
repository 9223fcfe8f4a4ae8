package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// sampleLines decodes --json output.
func sampleLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	return lines
}

func TestBenchSampleOneProcess(t *testing.T) {
	var out bytes.Buffer
	if err := benchSample([]string{"--json", "--n", "5000", "--batch", "64", "--iters", "3"}, &out); err != nil {
		t.Fatal(err)
	}
	lines := sampleLines(t, out.String())
	var modes []string
	for _, l := range lines {
		modes = append(modes, l["mode"].(string))
		if l["bench"] != "sample" || l["np"] != 1.0 || l["batch"] != 64.0 {
			t.Errorf("line %v", l)
		}
	}
	if strings.Join(modes, ",") != "uniform,prioritized,topk,update" {
		t.Fatalf("modes %v", modes)
	}
	if lines[1]["items_per_s"].(float64) <= 0 || lines[3]["updates_per_s_per_rank"].(float64) <= 0 {
		t.Fatalf("rates %v", lines)
	}
	if err := benchSample([]string{"--modes", "nope"}, &out); err == nil {
		t.Fatal("unknown mode accepted")
	}
}

func TestBenchCollectOneProcess(t *testing.T) {
	var out bytes.Buffer
	if err := benchCollect([]string{"--json", "--sizes", "4K,64K", "--items", "16", "--iters", "2"}, &out); err != nil {
		t.Fatal(err)
	}
	lines := sampleLines(t, out.String())
	var kinds []string
	for _, l := range lines {
		kinds = append(kinds, l["kind"].(string))
		if l["bench"] != "collect" || l["items"] != 16.0 || l["bytes_per_s"].(float64) <= 0 {
			t.Errorf("line %v", l)
		}
	}
	// One process: no remote line.
	if strings.Join(kinds, ",") != "copy,local,copy,local" {
		t.Fatalf("kinds %v", kinds)
	}
}
