// Package cudatest builds and inspects fake CUDA driver and NCCL libraries, so
// that package cuda's bindings, and gear's kernels themselves, are tested on
// machines without a GPU.
//
// Build compiles two shared libraries with the host's gcc and g++:
//
//   - libcuda.so.1 exports the driver entry points gear binds, with host memory
//     standing in for device memory. It parses the PTX it loads, records every
//     kernel launch with the bytes of each parameter, and executes gear's own
//     kernels: their CUDA C source is compiled into the library against a small
//     emulation of CUDA (emu.h) that runs each CUDA thread as a fiber.
//   - libnccl.so.2 matches the collectives and send/receives of communicators
//     created in one process (one goroutine per rank) and carries them out on
//     that host memory, holding the callers' streams busy until their peers
//     arrive; ncclCommAbort releases a rank's pending work.
//
// Point package cuda at them with cuda.WithLibrary (or GEAR_CUDA_LIB and
// GEAR_NCCL_LIB), and use FakeCUDA and FakeNCCL to inspect what they received.
// Builds are cached by the hash of their sources, flags and compiler under the
// user's cache directory.
//
// For tests that run on a real GPU too: OpenDriver and OpenGPU skip the test
// when there is no CUDA driver; ToDevice, FromDevice and Bytes move typed
// slices to and from device memory.
package cudatest

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/gear-rl/gear/cuda/internal/kernels"
)

//go:embed csrc/emu.h csrc/fakecuda.cc csrc/fakenccl.c
var csrc embed.FS

// Options select a variant of the fake libraries.
type Options struct {
	// InitError, if not 0, is the CUresult the fake cuInit returns (100 is
	// CUDA_ERROR_NO_DEVICE).
	InitError int
	// NoConfig leaves ncclCommInitRankConfig and ncclCommFinalize out of the
	// fake NCCL, as in NCCL before 2.14.
	NoConfig bool
}

// Libs are the paths of a built pair of fake libraries.
type Libs struct {
	Dir  string // holds both, under their real sonames
	CUDA string // .../libcuda.so.1
	NCCL string // .../libnccl.so.2
}

var (
	buildMu sync.Mutex
	built   = map[Options]Libs{}
)

// Build compiles (or finds in the cache) the fake libraries of the variant opts
// and returns their paths. It fails the test if no C or C++ compiler works.
func Build(tb testing.TB, opts Options) Libs {
	tb.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if l, ok := built[opts]; ok {
		return l
	}
	l, err := build(opts)
	if err != nil {
		tb.Fatalf("cudatest: building the fake CUDA and NCCL libraries: %v", err)
	}
	built[opts] = l
	return l
}

func build(opts Options) (Libs, error) {
	src, err := os.MkdirTemp("", "gear-cudatest-src-")
	if err != nil {
		return Libs{}, err
	}
	defer os.RemoveAll(src)
	h := sha256.New()
	write := func(fsys fs.FS, dir string) error {
		var names []string
		if err := fs.WalkDir(fsys, dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				names = append(names, p)
			}
			return err
		}); err != nil {
			return err
		}
		sort.Strings(names)
		for _, n := range names {
			b, err := fs.ReadFile(fsys, n)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "%s %d\n", filepath.Base(n), len(b))
			h.Write(b)
			if err := os.WriteFile(filepath.Join(src, filepath.Base(n)), b, 0o644); err != nil {
				return err
			}
		}
		return nil
	}
	if err := write(csrc, "csrc"); err != nil {
		return Libs{}, err
	}
	if err := write(kernels.Sources, "."); err != nil {
		return Libs{}, err
	}
	cudaCmd := []string{"g++", "-std=c++17", "-O2", "-fPIC", "-shared", "-ffp-contract=off",
		"-Wno-unknown-pragmas", "-I" + src, fmt.Sprintf("-DFAKE_INIT_ERROR=%d", opts.InitError),
		filepath.Join(src, "fakecuda.cc"), "-o", "libcuda.so.1", "-lpthread"}
	ncclCmd := []string{"gcc", "-std=gnu11", "-O2", "-fPIC", "-shared", "-D_GNU_SOURCE",
		filepath.Join(src, "fakenccl.c"), "-o", "libnccl.so.2", "-ldl", "-lpthread"}
	if opts.NoConfig {
		ncclCmd = append(ncclCmd, "-DFAKE_NO_CONFIG")
	}
	for _, c := range [][]string{cudaCmd, ncclCmd} {
		fmt.Fprintln(h, strings.ReplaceAll(strings.Join(c, " "), src, "SRC"))
		v, err := exec.Command(c[0], "--version").Output()
		if err != nil {
			return Libs{}, fmt.Errorf("%s: %v", c[0], err)
		}
		h.Write(v)
	}
	key := hex.EncodeToString(h.Sum(nil))[:24]
	root, err := os.UserCacheDir()
	if err != nil {
		root = os.TempDir()
	}
	dir := filepath.Join(root, "gear-cudatest", key)
	libs := Libs{Dir: dir, CUDA: filepath.Join(dir, "libcuda.so.1"), NCCL: filepath.Join(dir, "libnccl.so.2")}
	if _, err := os.Stat(filepath.Join(dir, "ok")); err == nil {
		return libs, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return Libs{}, err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), key+".tmp-")
	if err != nil {
		return Libs{}, err
	}
	defer os.RemoveAll(tmp)
	for _, c := range [][]string{cudaCmd, ncclCmd} {
		cmd := exec.Command(c[0], c[1:]...)
		cmd.Dir = tmp
		if out, err := cmd.CombinedOutput(); err != nil {
			return Libs{}, fmt.Errorf("%s: %v\n%s", strings.Join(c, " "), err, out)
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, "ok"), nil, 0o644); err != nil {
		return Libs{}, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Another process built the same key first; use its copy.
		if _, statErr := os.Stat(filepath.Join(dir, "ok")); statErr != nil {
			return Libs{}, err
		}
	}
	return libs, nil
}

// Launch is what the fake driver recorded of a kernel launch.
type Launch struct {
	Name        string
	Grid, Block [3]uint32
	SharedMem   uint32
	Stream      uintptr
	Params      [][]byte // the bytes of each kernel parameter, sized as the PTX declares
}

// What FakeCUDA.Live counts.
const (
	LiveDeviceAllocs = iota
	LiveHostAllocs
	LiveRegistrations
	LiveStreams
	LiveEvents
	LiveModules
	LiveContextRefs
	// Reclaimed counts objects (allocations, registrations, modules, streams,
	// events) that were still alive when their primary context's last
	// reference was released, so the driver destroyed them with it: memory
	// freed after its device was closed.
	Reclaimed
	// LiveIPCMappings counts other processes' device memory opened here
	// (cuIpcOpenMemHandle) and not yet closed.
	LiveIPCMappings
)

// FakeCUDA inspects and steers a loaded fake libcuda.so.1.
type FakeCUDA struct {
	launches   func() int32
	lastLaunch func(name *byte, cap int32, dims *uint32, shmem *uint32, stream *uintptr) int32
	lastParam  func(i int32, out *byte, cap int32) int32
	live       func(kind int32) int32
	hostFlags  func(p unsafe.Pointer) int32
	fail       func(fn string, code, times int32)
	hold       func(stream uintptr, delta int32) int32
}

// OpenFakeCUDA opens the fake driver at path (the same library package cuda
// loads, since the loader returns one copy per path).
func OpenFakeCUDA(tb testing.TB, path string) *FakeCUDA {
	tb.Helper()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		tb.Fatalf("cudatest: %v", err)
	}
	f := &FakeCUDA{}
	purego.RegisterLibFunc(&f.launches, h, "fakecuda_launches")
	purego.RegisterLibFunc(&f.lastLaunch, h, "fakecuda_last_launch")
	purego.RegisterLibFunc(&f.lastParam, h, "fakecuda_last_param")
	purego.RegisterLibFunc(&f.live, h, "fakecuda_live")
	purego.RegisterLibFunc(&f.hostFlags, h, "fakecuda_host_flags")
	purego.RegisterLibFunc(&f.fail, h, "fakecuda_fail")
	purego.RegisterLibFunc(&f.hold, h, "fakecuda_stream_hold")
	return f
}

// Launches counts the kernel launches the fake accepted.
func (f *FakeCUDA) Launches() int { return int(f.launches()) }

// LastLaunch returns the last accepted launch.
func (f *FakeCUDA) LastLaunch() Launch {
	name := make([]byte, 256)
	var dims [6]uint32
	var l Launch
	n := f.lastLaunch(&name[0], int32(len(name)), &dims[0], &l.SharedMem, &l.Stream)
	l.Name = string(name[:indexByte(name, 0)])
	copy(l.Grid[:], dims[:3])
	copy(l.Block[:], dims[3:])
	for i := range n {
		buf := make([]byte, 256)
		size := f.lastParam(i, &buf[0], int32(len(buf)))
		if int(size) > len(buf) { // a struct parameter: ask again with room for it
			buf = make([]byte, size)
			size = f.lastParam(i, &buf[0], int32(len(buf)))
		}
		l.Params = append(l.Params, buf[:size])
	}
	return l
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return len(b)
}

// Live counts live objects of one kind (LiveDeviceAllocs, ...).
func (f *FakeCUDA) Live(kind int) int { return int(f.live(int32(kind))) }

// HostFlags returns the flags host memory at p was allocated (cuMemHostAlloc) or
// registered (cuMemHostRegister) with, or -1.
func (f *FakeCUDA) HostFlags(p unsafe.Pointer) int { return int(f.hostFlags(p)) }

// Fail makes the next times calls of the driver function fn return code. Every
// call of the fake takes it but cuInit (Options.InitError), cuDriverGetVersion
// and the error-text calls; one failure is pending at a time, and a later Fail
// replaces it.
func (f *FakeCUDA) Fail(fn string, code, times int) { f.fail(fn+"\x00", int32(code), int32(times)) }

// Hold keeps a stream busy while its holds are positive, as if a kernel were
// still running on it: cuStreamQuery says not ready, and so does cuEventQuery
// for events last recorded on it. delta -1 undoes a hold.
func (f *FakeCUDA) Hold(stream uintptr, delta int) {
	if r := f.hold(stream, int32(delta)); r != 0 {
		panic(fmt.Sprintf("cudatest: fakecuda_stream_hold(%#x): CUresult %d", stream, r))
	}
}

// What FakeNCCL.Count counts.
const (
	CountAborts = iota
	CountMisuse
	CountLiveComms
	CountDestroys
	CountFinalizes
	CountUniqueIDs
)

// FakeNCCL inspects a loaded fake libnccl.so.2.
type FakeNCCL struct {
	lastInit func(id *byte, nranks, rank, blocking *int32, cfgVersion *uint32, cfgSize *uint64) int32
	count    func(what int32) int32
}

// Init is what the fake NCCL's last ncclCommInitRank or ncclCommInitRankConfig
// received.
type Init struct {
	Config        bool // through ncclCommInitRankConfig
	ID            [128]byte
	NRanks, Rank  int
	Blocking      int // config.blocking
	ConfigVersion uint32
	ConfigSize    uint64
}

// OpenFakeNCCL opens the fake NCCL at path.
func OpenFakeNCCL(tb testing.TB, path string) *FakeNCCL {
	tb.Helper()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		tb.Fatalf("cudatest: %v", err)
	}
	f := &FakeNCCL{}
	purego.RegisterLibFunc(&f.lastInit, h, "fakenccl_last_init")
	purego.RegisterLibFunc(&f.count, h, "fakenccl_count")
	return f
}

// LastInit returns what the last communicator creation received; ok is false
// before the first.
func (f *FakeNCCL) LastInit() (in Init, ok bool) {
	var nr, r, b int32
	kind := f.lastInit(&in.ID[0], &nr, &r, &b, &in.ConfigVersion, &in.ConfigSize)
	in.NRanks, in.Rank, in.Blocking, in.Config = int(nr), int(r), int(b), kind == 1
	return in, kind >= 0
}

// Count returns one of the fake's counters (CountAborts, ...).
func (f *FakeNCCL) Count(what int) int { return int(f.count(int32(what))) }
