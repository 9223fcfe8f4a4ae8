package gmi

import (
	"context"
	"strings"
	"testing"
)

func TestDiscoverReadsTopologyFile(t *testing.T) {
	path := topologies + "/v100-4x.toml"
	getenv := func(k string) string {
		if k == EnvTopology {
			return path
		}
		return ""
	}
	topo, err := Discover(context.Background(), WithGetenv(getenv))
	if err != nil {
		t.Fatal(err)
	}
	if topo.Source != SourceFile || topo.Path != path || len(topo.GPUs) != 4 || !topo.MPS.Running {
		t.Errorf("from GEAR_TOPOLOGY: %+v", topo)
	}
	// An explicit file wins over GEAR_TOPOLOGY.
	topo, err = Discover(context.Background(), WithGetenv(getenv), WithTopologyFile(topologies+"/p100-2x.toml"))
	if err != nil || len(topo.GPUs) != 2 {
		t.Errorf("explicit file: %+v, %v", topo, err)
	}
	_, err = Discover(context.Background(), WithTopologyFile(topologies+"/nope.toml"))
	if err == nil || !strings.HasPrefix(err.Error(), "gmi: topology file") {
		t.Errorf("missing file: %v", err)
	}
}

func TestTopologyText(t *testing.T) {
	var sb strings.Builder
	if err := loadExample(t, "a100-mig-mixed.toml").WriteText(&sb); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	for _, want := range []string{"source: topology file", "MPS: not running", "sm_80", "40.0 GiB", "on", "1/0", "3g.20gb", "19.5 GiB", "MIG-1f6d2a40-8b3c-5e7f-a1d2-3c4b5a6e7f01"} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	sb.Reset()
	(&Topology{Source: SourceNone, Reason: "NVML: ERROR_LIBRARY_NOT_FOUND"}).WriteText(&sb)
	if !strings.Contains(sb.String(), "source: none (NVML: ERROR_LIBRARY_NOT_FOUND)") || !strings.Contains(sb.String(), "no GPUs") {
		t.Errorf("no GPUs text:\n%s", sb.String())
	}
}
