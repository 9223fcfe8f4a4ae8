package rank

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// notContract are the fields of Info that are no fact of the contract: the
// decoder fills them in (Source: where it read the facts; ServeRdzv: a SLURM
// rank 0 that no launcher coordinates). Every other field must travel.
var notContract = []string{"Source", "ServeRdzv"}

// fullInfo is an Info whose contract fields are all set, none to what the
// decoder would default it to, with room to grow each by one and stay valid.
func fullInfo() Info {
	return Info{
		Rank: 5, Size: 9, LocalRank: 2, LocalSize: 4, NodeRank: 1, NumNodes: 3,
		Role: "trainer", RoleRank: 3,
		RdzvAddr: "10.0.0.1:7000", RdzvTimeout: 17 * time.Second,
		JobID: "11111111-2222-3333-4444-555555555555", Token: "tok",
		Restart: 7, CheckpointDir: "/ckpt/job",
		HeartbeatInterval: 300 * time.Millisecond, HeartbeatTimeout: 20 * time.Second,
		Source: SourceGear,
	}
}

// decodeEnviron reads env ("NAME=value" entries) back with FromLookup.
func decodeEnviron(t *testing.T, env []string) (Info, error) {
	t.Helper()
	m := map[string]string{}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			t.Fatalf("entry %q: want NAME=value", kv)
		}
		if _, dup := m[k]; dup {
			t.Fatalf("%s set twice in %q", k, env)
		}
		m[k] = v
	}
	return FromLookup(lookupMap(m))
}

// contractFields are Info's fields less notContract, by reflection, so that a
// field added to Info joins the round trip without anyone listing it.
func contractFields(t *testing.T) []reflect.StructField {
	var fields []reflect.StructField
	for f := range reflect.TypeFor[Info]().Fields() {
		if !slices.Contains(notContract, f.Name) {
			fields = append(fields, f)
		}
	}
	if len(fields) == 0 {
		t.Fatal("Info has no contract field")
	}
	return fields
}

// Encoding an Info, then decoding it, gives back the same Info, field for
// field: a field that Environ leaves out, or that FromLookup does not read,
// fails here.
func TestContractRoundTrip(t *testing.T) {
	base := fullInfo()
	for _, f := range contractFields(t) {
		if reflect.ValueOf(base).FieldByIndex(f.Index).IsZero() {
			t.Errorf("fullInfo leaves Info.%s zero: give it a value that the decoder would not default to, and encode it in Info.Environ", f.Name)
		}
	}
	got, err := decodeEnviron(t, base.Environ())
	if err != nil {
		t.Fatalf("FromLookup(Environ): %v", err)
	}
	if got != base {
		t.Fatalf("round trip:\n got %#v\nwant %#v", got, base)
	}
	// Each field alone, moved off fullInfo's value: a value that happens to
	// be the decoder's default (RdzvTimeout's 60s, LocalRank = Rank) would
	// hide a field that is not encoded.
	for _, f := range contractFields(t) {
		want := fullInfo()
		v := reflect.ValueOf(&want).Elem().FieldByIndex(f.Index)
		switch {
		case f.Type == reflect.TypeFor[time.Duration]():
			v.SetInt(v.Int() + int64(time.Second))
		case f.Type.Kind() == reflect.Int:
			v.SetInt(v.Int() + 1)
		case f.Type.Kind() == reflect.String:
			v.SetString(v.String() + "-x")
		default:
			t.Fatalf("Info.%s: the round trip has no value for a %s; teach it one", f.Name, f.Type)
		}
		got, err := decodeEnviron(t, want.Environ())
		if err != nil {
			t.Errorf("Info.%s = %v: FromLookup(Environ): %v", f.Name, v, err)
			continue
		}
		if got != want {
			t.Errorf("Info.%s = %v: round trip gives\n %#v\nwant %#v", f.Name, v, got, want)
		}
	}
}

// Environ sets exactly ContractEnv's names, in its order, and each name
// carries a fact: leaving it out changes what the rank reads (or fails).
func TestContractEnvIsWhatEnvironSets(t *testing.T) {
	env := fullInfo().Environ()
	var names []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		names = append(names, name)
	}
	if !slices.Equal(names, ContractEnv()) {
		t.Fatalf("Environ sets %q, ContractEnv lists %q", names, ContractEnv())
	}
	for i, name := range names {
		less := slices.Delete(slices.Clone(env), i, i+1)
		got, err := decodeEnviron(t, less)
		if err == nil && got == fullInfo() {
			t.Errorf("without %s the rank reads the same Info: the name carries no fact", name)
		}
	}
}

func TestLauncherEnv(t *testing.T) {
	all := LauncherEnv()
	want := append(ContractEnv(), EnvNodeName, EnvJobSpec)
	want = append(want, DeviceEnv()...)
	if !slices.Equal(all, want) {
		t.Fatalf("LauncherEnv %q, want the contract, node name, spec path and device binding %q", all, want)
	}
	seen := map[string]bool{}
	for _, name := range all {
		if seen[name] {
			t.Errorf("LauncherEnv lists %s twice", name)
		}
		seen[name] = true
	}
	// torchrun's variables are no launcher's own: a rank's env may override
	// them, so no list here may hold them.
	torch := TorchEnv{MasterPort: 1, LocalWorldSize: 2}
	for _, kv := range append(torch.Environ(), torch.Defaults()...) {
		if name, _, _ := strings.Cut(kv, "="); seen[name] {
			t.Errorf("LauncherEnv lists torchrun's %s", name)
		}
	}
	// The lists are the caller's.
	ContractEnv()[0] = "X"
	DeviceEnv()[0] = "X"
	LauncherEnv()[0] = "X"
	if ContractEnv()[0] != EnvRank || DeviceEnv()[0] != EnvCUDAVisibleDevices || LauncherEnv()[0] != EnvRank {
		t.Fatal("a caller's change to a list reached the next caller")
	}
}

func TestMergeEnv(t *testing.T) {
	base := []string{"PATH=/bin", EnvRank + "=7", "A=0", EnvCheckpointDir + "=/parent", "DROP=1", "B=0"}
	add := []string{"B=1", EnvRank + "=2", "C=1", "B=2"}
	kept := slices.Clone(base)
	got := MergeEnv(base, add, "DROP")
	want := []string{"PATH=/bin", "A=0", "B=2", EnvRank + "=2", "C=1"}
	if !slices.Equal(got, want) {
		t.Fatalf("MergeEnv = %q, want %q", got, want)
	}
	if !slices.Equal(base, kept) {
		t.Fatalf("MergeEnv changed base: %q", base)
	}
	// Defaults at the front of base give way to the inherited value.
	got = MergeEnv([]string{EnvOMPNumThreads + "=1", "PATH=/bin", EnvOMPNumThreads + "=4"}, nil)
	if want := []string{EnvOMPNumThreads + "=4", "PATH=/bin"}; !slices.Equal(got, want) {
		t.Fatalf("MergeEnv with a default = %q, want %q", got, want)
	}
	// No contract variable, nor the launcher's GMI layout, is inherited,
	// whatever the caller drops.
	var parent []string
	for _, name := range append(ContractEnv(), EnvGMILayout) {
		parent = append(parent, name+"=parent")
	}
	if got := MergeEnv(parent, nil); len(got) != 0 {
		t.Fatalf("inherited the parent's place: %q", got)
	}
}
