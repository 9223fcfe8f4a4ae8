package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The launcher and the packages every rank program uses must link no GPU
// binding: package cuda loads libcuda with purego, which makes a binary
// dynamically linked, and the dynamic loader costs every process start a few
// milliseconds (docs/benchmarks.md, launch). GPU code lives in packages that
// only GPU programs import (cuda, collective/nccl).
func TestLauncherLinksNoGPUBinding(t *testing.T) {
	pkgs := []string{"github.com/gear-rl/gear/cmd/gearrun", "github.com/gear-rl/gear/launch", "github.com/gear-rl/gear/rank", "github.com/gear-rl/gear/collective", "github.com/gear-rl/gear/store"}
	out, err := exec.Command("go", append([]string{"list", "-deps"}, pkgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "github.com/gear-rl/gear/cuda" || strings.HasPrefix(dep, "github.com/gear-rl/gear/collective/nccl") || strings.Contains(dep, "purego") {
			t.Errorf("%s depend on %s, a GPU binding", strings.Join(pkgs, ", "), dep)
		}
	}
}

// TestGearrunIsStatic builds gearrun as CI and the README do (no cgo) and
// checks that it has no program interpreter, that is, that it starts without
// the dynamic loader.
func TestGearrunIsStatic(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "gearrun")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("gearrun built with CGO_ENABLED=0 has a program interpreter (PT_INTERP): it is dynamically linked")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("gearrun imports shared libraries %v", libs)
	}
}
