package kernels

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// TestSumsMatchSources checks, without nvcc, that gear.ptx was generated from the
// sources as they are: `make ptx` records the hash of every source beside the
// hash of the PTX it wrote.
func TestSumsMatchSources(t *testing.T) {
	recorded := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(Sums), "\n") {
		hash, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q is not sha256sum output", line)
		}
		recorded[strings.TrimPrefix(name, "*")] = hash
	}
	srcs, err := fs.Glob(Sources, "*.cu*")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range srcs {
		b, err := fs.ReadFile(Sources, name)
		if err != nil {
			t.Fatal(err)
		}
		switch h, ok := recorded[name]; {
		case !ok:
			t.Errorf("%s is not in SHA256SUMS: run `make ptx`", name)
		case h != sum(b):
			t.Errorf("%s changed since gear.ptx was generated: run `make ptx`", name)
		}
		delete(recorded, name)
	}
	if h := recorded["gear.ptx"]; h != sum([]byte(PTX)) {
		t.Errorf("gear.ptx does not match SHA256SUMS: run `make ptx`")
	}
	delete(recorded, "gear.ptx")
	for name := range recorded {
		t.Errorf("SHA256SUMS lists %s, which is not a source: run `make ptx`", name)
	}
}

// TestPTXTarget checks that the PTX is for compute_80 in an ISA version that
// CUDA 12 and 13 drivers load.
func TestPTXTarget(t *testing.T) {
	if !regexp.MustCompile(`(?m)^\.target sm_80$`).MatchString(PTX) {
		t.Error("gear.ptx does not target sm_80")
	}
	m := regexp.MustCompile(`(?m)^\.version (\d+)\.(\d+)$`).FindStringSubmatch(PTX)
	if m == nil {
		t.Fatal("gear.ptx has no .version")
	}
	if major, _ := strconv.Atoi(m[1]); major < 7 || major > 8 {
		t.Errorf("PTX ISA %s.%s: want 7.x or 8.x", m[1], m[2])
	}
	for _, k := range []string{"gear_gather_v16", "gear_ws_tiles_f32", "gear_ws_scan", "gear_ws_draws_f64", "gear_topk_hist_f32", "gear_topk_collect_f64"} {
		if !strings.Contains(PTX, ".entry "+k+"(") {
			t.Errorf("gear.ptx lacks kernel %s", k)
		}
	}
}

// nvcc finds a CUDA compiler: $NVCC, nvcc on the path, or the project's
// ../shared/tools/nvcc beside the repository.
func nvcc(t *testing.T) string {
	if p := os.Getenv("NVCC"); p != "" {
		if abs, err := filepath.Abs(p); err == nil && strings.ContainsRune(p, filepath.Separator) {
			return abs
		}
		return p
	}
	if p, err := exec.LookPath("nvcc"); err == nil {
		return p
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			// The project's nvcc fetches Debian's CUDA compiler packages on its
			// first run; the tests use it only once that is done (make ptx has
			// run), or when GEAR_PTX_CHECK=1 asks for the fetch.
			if os.Getenv("GEAR_PTX_CHECK") != "1" && !nvccCached() {
				return ""
			}
			return filepath.Join(dir, "..", "shared", "tools", "nvcc")
		}
		if filepath.Dir(dir) == dir {
			return ""
		}
	}
}

// nvccCached reports whether the project's nvcc has its compiler in its cache.
func nvccCached() bool {
	cache := os.Getenv("GEAR_NVCC_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return false
		}
		cache = filepath.Join(home, ".cache", "gear-nvcc")
	}
	_, err := os.Stat(filepath.Join(cache, "root", "usr", "lib", "nvidia-cuda-toolkit", "bin", "nvcc"))
	return err == nil
}

// TestCompilerRecorded checks that `make ptx` recorded the compiler it ran.
func TestCompilerRecorded(t *testing.T) {
	if !regexp.MustCompile(`^Cuda compilation tools, release \d+\.\d+, V[\d.]+\n?$`).MatchString(Compiler) {
		t.Errorf("NVCC_VERSION is %q, want nvcc's release line: run `make ptx`", Compiler)
	}
}

// releaseLine picks the release line out of `nvcc --version`'s output.
func releaseLine(out []byte) string {
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "Cuda compilation tools") {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// TestPTXIsCurrent recompiles gear.cu with nvcc and compares the result with the
// embedded PTX. It skips when no nvcc can be run, and when the nvcc found is
// not the release that made gear.ptx (NVCC_VERSION): another release makes
// other PTX from the same sources.
func TestPTXIsCurrent(t *testing.T) {
	cc := nvcc(t)
	if cc == "" {
		t.Skip("skipping: no nvcc ($NVCC, PATH, or ../shared/tools/nvcc once `make ptx` has fetched it; GEAR_PTX_CHECK=1 fetches it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	// The first run of the project's nvcc fetches the compiler; a failure here
	// means there is no compiler to run, not that the sources are wrong.
	version, err := exec.CommandContext(ctx, cc, "--version").Output()
	if err != nil {
		t.Skipf("skipping: %s cannot run: %v\n%s", cc, err, lastLines(version, 5))
	}
	want := strings.TrimSpace(Compiler)
	if got := releaseLine(version); got != want {
		t.Skipf("skipping: gear.ptx was made by %q, and %s is %q, whose PTX differs; run that release, or `make ptx` with this one and commit the result", want, cc, got)
	}
	// Compile the embedded sources, so the test runs from any directory.
	dir := t.TempDir()
	srcs, err := fs.Glob(Sources, "*.cu*")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range srcs {
		b, err := fs.ReadFile(Sources, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "out.ptx")
	cmd := exec.CommandContext(ctx, cc, "-ptx", "-arch=compute_80", "-o", out, Main)
	cmd.Dir = dir
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, msg)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, []byte(PTX)) {
		t.Fatalf("gear.ptx is stale: nvcc makes %d bytes of other PTX from the sources (embedded: %d); run `make ptx`", len(got), len(PTX))
	}
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
