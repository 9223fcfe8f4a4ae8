package gmi

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const topologies = "../examples/topologies"

func loadExample(t *testing.T, name string) *Topology {
	t.Helper()
	topo, err := LoadTopology(filepath.Join(topologies, name))
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

func TestExampleTopologiesLoad(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(topologies, "*.toml"))
	if err != nil || len(files) < 5 {
		t.Fatalf("example topologies: %v, %v", files, err)
	}
	for _, f := range files {
		topo, err := LoadTopology(f)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if topo.Source != SourceFile || topo.Path != f || len(topo.GPUs) == 0 {
			t.Errorf("%s: %+v", f, topo)
		}
	}
}

func TestTopologyFileFields(t *testing.T) {
	topo := loadExample(t, "a100-mig-mixed.toml")
	if topo.MPS.Running || topo.Driver != "550.54.15" {
		t.Errorf("mps %+v driver %q", topo.MPS, topo.Driver)
	}
	if len(topo.GPUs) != 2 {
		t.Fatalf("%d GPUs", len(topo.GPUs))
	}
	g := topo.GPUs[0]
	if g.Index != 0 || g.Name != "NVIDIA A100-SXM4-40GB" || g.Compute != (ComputeCapability{8, 0}) ||
		g.MemoryBytes != 40<<30 || !g.MIGMode || len(g.MIG) != 4 {
		t.Errorf("GPU 0: %+v", g)
	}
	var profiles []string
	for _, m := range g.MIG {
		profiles = append(profiles, m.Profile)
	}
	if strings.Join(profiles, " ") != "3g.20gb 2g.10gb 1g.5gb 1g.5gb" {
		t.Errorf("profiles %v", profiles)
	}
	if g.MIG[1].UUID != "MIG-1f6d2a40-8b3c-5e7f-a1d2-3c4b5a6e7f02" || g.MIG[1].GPUInstance != 5 || g.MIG[1].SMs != 28 || g.MIG[1].MemoryBytes != 9856<<20 {
		t.Errorf("instance 1: %+v", g.MIG[1])
	}
	v := loadExample(t, "v100-4x.toml")
	if v.GPUs[3].Compute.SM() != 70 || v.GPUs[3].Compute.String() != "sm_70" || !v.MPS.Running {
		t.Errorf("v100: %+v", v)
	}
}

func TestParseTopologyDefaults(t *testing.T) {
	topo, err := ParseTopology("t.toml", []byte(`
[[gpu]]
compute_capability = "9.0"
[[gpu]]
compute_capability = "sm_86"
mig = false
[[gpu]]
index = 7
compute_capability = "8.0"
uuid = "GPU-x"
mig = true
  [[gpu.instances]]
  profile = "1g.10gb"
  gi = 3
  [[gpu.instances]]
  profile = "1c.2g.20gb"
  gi = 0
  ci = 1
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.GPUs) != 3 || topo.GPUs[0].Index != 0 || topo.GPUs[1].Index != 1 || topo.GPUs[2].Index != 7 {
		t.Fatalf("%+v", topo.GPUs)
	}
	if topo.GPUs[1].Compute != (ComputeCapability{8, 6}) {
		t.Errorf("sm_86 read as %v", topo.GPUs[1].Compute)
	}
	mig := topo.GPUs[2].MIG
	// Sorted by (gi, ci): the second entry (gi 0, ci 1) comes first.
	if len(mig) != 2 || mig[0].Profile != "1c.2g.20gb" || mig[1].GPUInstance != 3 || mig[1].ComputeInstance != 0 {
		t.Errorf("MIG %+v", mig)
	}
	dev, err := topo.GPUs[2].visibleDevice(mig[0])
	if err != nil || dev != "MIG-GPU-x/0/1" {
		t.Errorf("visible device %q, %v", dev, err)
	}
	empty, err := ParseTopology("e.toml", nil)
	if err != nil || len(empty.GPUs) != 0 || empty.Source != SourceFile {
		t.Errorf("empty file: %+v, %v", empty, err)
	}
}

func TestParseTopologyErrors(t *testing.T) {
	cases := []struct {
		doc, want string
	}{
		{"[[gpu]]\ncompute_capability = \"8.0\"\nmemroy_mib = 4\n", "t.toml:3:1: unknown key gpu[0].memroy_mib"},
		{"[[gpu]]\nname = \"B\"\ncompute_capability = \"8.0\"\nmemory_mib = \"lots\"\n", "t.toml:4:14: gpu[0].memory_mib: want uint64, got TOML string"},
		{"[[gpu]]\ncompute_capability = \"8.0\"\nuuid = \"GPU-a\"\n[[gpu]]\ncompute_capability = \"8.0\"\nuuid = \"GPU-b\"\nmig = true\n[[gpu.instances]]\nprofile = \"1g.10gb\"\n[[gpu.instances]]\ngi = \"one\"\n", "t.toml:11:6: gpu[1].instances[1].gi: want int, got TOML string"},
		{"[[gpu]]\ncompute_capability = \"8.0\"\nmemory_mib = -5\n", "gpu[0].memory_mib: "},
		{"[[gpu]]\ncompute_capability = 8\n", "t.toml:2:"},
		{"[[gpu]]\nname = \"x\"\n", "gpu[0]: compute_capability missing"},
		{"[[gpu]]\ncompute_capability = \"eight\"\n", "gpu[0]: compute capability \"eight\""},
		{"[[gpu]]\ncompute_capability = \"7.0\"\nmig = true\n", "MIG needs sm_80"},
		{"[[gpu]]\ncompute_capability = \"8.0\"\n[[gpu.instances]]\nprofile = \"1g.5gb\"\nuuid = \"MIG-a\"\n", "gpu[0]: MIG instances listed but mig = false"},
		{"[[gpu]]\ncompute_capability = \"8.0\"\nmig = true\n[[gpu.instances]]\nprofile = \"1g.5gb\"\n", "gpu[0].instances[0]: uuid missing"},
		{"[[gpu]]\ncompute_capability = \"8.0\"\nmig = true\n[[gpu.instances]]\nprofile = \"big\"\nuuid = \"MIG-a\"\n", "gpu[0].instances[0]: MIG profile \"big\""},
		{"[[gpu]]\ncompute_capability = \"8.0\"\nmig = true\n[[gpu.instances]]\nprofile = \"1g.5gb\"\nuuid = \"MIG-a\"\n[[gpu.instances]]\nprofile = \"1g.5gb\"\nuuid = \"MIG-a\"\n", "uuid \"MIG-a\" already used by gpu[0].instances[0]"},
		{"[[gpu]]\ncompute_capability = \"8.0\"\nmig = true\nuuid = \"G\"\n[[gpu.instances]]\nprofile = \"1g.5gb\"\ngi = 1\n[[gpu.instances]]\nprofile = \"1g.5gb\"\ngi = 1\n", "gi 1 ci 0 appears twice"},
		{"[[gpu]]\nindex = 1\ncompute_capability = \"8.0\"\n[[gpu]]\nindex = 1\ncompute_capability = \"8.0\"\n", "gpu[1]: index 1 appears twice"},
		{"[[gpu]]\nindex = -1\ncompute_capability = \"8.0\"\n", "negative"},
		{"[mps]\nrunning = \"yes\"\n", "t.toml:2:"},
		{"gpus = 3\n", "unknown key gpus"},
	}
	for _, c := range cases {
		_, err := ParseTopology("t.toml", []byte(c.doc))
		if err == nil || !strings.HasPrefix(err.Error(), "gmi: topology file t.toml") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("doc %q:\n error %v\n want one containing %q", c.doc, err, c.want)
		}
	}
	if _, err := LoadTopology(filepath.Join(t.TempDir(), "missing.toml")); err == nil || !strings.Contains(err.Error(), "missing.toml") {
		t.Errorf("missing file: %v", err)
	}
}

func TestComputeCapability(t *testing.T) {
	good := map[string]ComputeCapability{"8.0": {8, 0}, "9.0": {9, 0}, "12.1": {12, 1}, "sm_70": {7, 0}, "sm_120": {12, 0}}
	for s, want := range good {
		got, err := ParseComputeCapability(s)
		if err != nil || got != want {
			t.Errorf("ParseComputeCapability(%q) = %v, %v", s, got, err)
		}
	}
	for _, s := range []string{"", "8", "8.", ".0", "+8.0", "8.-0", "8.10", "sm_", "sm_8", "sm_+80", "0.5"} {
		if _, err := ParseComputeCapability(s); err == nil {
			t.Errorf("ParseComputeCapability(%q): no error", s)
		}
	}
	text, _ := ComputeCapability{8, 6}.MarshalText()
	if string(text) != "8.6" {
		t.Errorf("MarshalText = %s", text)
	}
}

func TestMIGProfileNames(t *testing.T) {
	for _, s := range []string{"1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", "7g.80gb", "1c.2g.10gb", "1g.5gb+me", "1g.23gb+me.all", "1g.24gb-me", "2g.20gb+gfx"} {
		p, err := ParseMIGProfile(s)
		if err != nil || p.String() != s {
			t.Errorf("ParseMIGProfile(%q) = %+v (%s), %v", s, p, p, err)
		}
	}
	for _, s := range []string{"", "1g", "1g.5", "g.5gb", "0g.5gb", "1g.5gb+", "1g.5gb+ME", "2c.2g.10gb", "1c.1c.2g.10gb", "1x.5gb"} {
		if _, err := ParseMIGProfile(s); err == nil {
			t.Errorf("ParseMIGProfile(%q): no error", s)
		}
	}
	// Names as nvidia-smi gives them, from NVML's figures for a 40 GB and an
	// 80 GB A100.
	a40, a80 := uint64(40<<30), uint64(80<<30)
	cases := []struct {
		gi, ci uint32
		mem    uint64
		gpu    uint64
		attrs  string
		want   string
	}{
		{1, 1, 4864, a40, "", "1g.5gb"},
		{1, 1, 4864, a40, "+me", "1g.5gb+me"},
		{1, 1, 9856, a40, "", "1g.10gb"},
		{2, 2, 9856, a40, "", "2g.10gb"},
		{2, 1, 9856, a40, "", "1c.2g.10gb"},
		{3, 3, 19968, a40, "", "3g.20gb"},
		{4, 4, 19968, a40, "", "4g.20gb"},
		{7, 7, 40192, a40, "", "7g.40gb"},
		{1, 1, 9728, a80, "", "1g.10gb"},
		{3, 3, 40192, a80, "", "3g.40gb"},
		{7, 7, 80896, a80, "", "7g.80gb"},
		{1, 1, 10240, 0, "", "1g.10gb"},
	}
	for _, c := range cases {
		if got := migProfileName(c.gi, c.ci, c.mem, c.gpu, c.attrs); got != c.want {
			t.Errorf("migProfileName(%d, %d, %d MiB, %d) = %s, want %s", c.gi, c.ci, c.mem, c.gpu, got, c.want)
		}
	}
}

func FuzzParseTopology(f *testing.F) {
	f.Add([]byte("[[gpu]]\ncompute_capability = \"8.0\"\nmig = true\nuuid = \"G\"\n[[gpu.instances]]\nprofile = \"1g.5gb\"\n"))
	f.Add([]byte("[mps]\nrunning = true\n"))
	f.Fuzz(func(t *testing.T, doc []byte) {
		topo, err := ParseTopology("f.toml", doc)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "gmi: topology file f.toml") {
				t.Fatalf("error without prefix: %v", err)
			}
			return
		}
		// Whatever parses can be planned on without a panic.
		for _, k := range []int{1, 2, 3} {
			_, _ = NewPlan(topo, PlanRequest{Ranks: 3, GMIPerGPU: k})
		}
	})
}

func TestTopologyJSONRoundTrip(t *testing.T) {
	topo := loadExample(t, "a100-mig-mixed.toml")
	b, err := json.Marshal(topo)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"compute_capability":"8.0"`) {
		t.Errorf("JSON %s", b)
	}
	var back Topology
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, topo) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, *topo)
	}
	if err := json.Unmarshal([]byte(`{"gpus":[{"compute_capability":"8"}]}`), &back); err == nil {
		t.Error("bad compute capability accepted")
	}
}

// TestTopologyFileDerivedMIGUUID: a MIG instance without a uuid, in a GPU
// with one, carries the UUID that a rank bound to it gets
// (MIG-<GPU uuid>/<gi>/<ci>), so that gearrun gpus shows it.
func TestTopologyFileDerivedMIGUUID(t *testing.T) {
	doc := "[[gpu]]\ncompute_capability = \"8.0\"\nuuid = \"GPU-abc\"\nmig = true\n[[gpu.instances]]\nprofile = \"1g.10gb\"\ngi = 1\nci = 2\n"
	topo, err := ParseTopology("t.toml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if got := topo.GPUs[0].MIG[0].UUID; got != "MIG-GPU-abc/1/2" {
		t.Errorf("MIG instance's UUID %q, want MIG-GPU-abc/1/2", got)
	}
	var b strings.Builder
	topo.WriteText(&b)
	if !strings.Contains(b.String(), "MIG-GPU-abc/1/2") {
		t.Errorf("gearrun gpus's table lacks the MIG UUID:\n%s", b.String())
	}
}
