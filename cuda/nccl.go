package cuda

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// UniqueID is an ncclUniqueId: the 128 bytes that rank 0 creates and every rank
// of a new communicator passes to NCCLComm creation.
type UniqueID [128]byte

// ncclUniqueID is UniqueID as a C struct, passed by value.
type ncclUniqueID struct {
	internal [128]byte
}

// ncclConfig is ncclConfig_t as NCCL 2.14 defined it (ncclConfig_v21400). Later
// versions extend the struct and read an older one by its size and version.
type ncclConfig struct {
	size     uint64
	magic    uint32
	version  uint32
	blocking int32
	_        int32
}

const (
	ncclConfigMagic   = 0xcafebeef
	ncclConfigVersion = 21400
)

type ncclFuncs struct {
	getVersion, getUniqueID, getErrorString, getLastError   uintptr
	commInitRank, commInitRankConfig                        uintptr
	commGetAsyncError, commAbort, commFinalize, commDestroy uintptr
	allReduce, broadcast, reduce, allGather, reduceScatter  uintptr
	send, recv, groupStart, groupEnd                        uintptr
	commCount, commUserRank                                 uintptr
}

func (f *ncclFuncs) symbols() []symbol {
	return []symbol{
		sym(&f.getVersion, "ncclGetVersion"),
		sym(&f.getUniqueID, "ncclGetUniqueId"),
		sym(&f.getErrorString, "ncclGetErrorString"),
		optSym(&f.getLastError, "ncclGetLastError"),
		sym(&f.commInitRank, "ncclCommInitRank"),
		optSym(&f.commInitRankConfig, "ncclCommInitRankConfig"),
		sym(&f.commGetAsyncError, "ncclCommGetAsyncError"),
		sym(&f.commAbort, "ncclCommAbort"),
		optSym(&f.commFinalize, "ncclCommFinalize"),
		sym(&f.commDestroy, "ncclCommDestroy"),
		sym(&f.allReduce, "ncclAllReduce"),
		sym(&f.broadcast, "ncclBroadcast"),
		sym(&f.reduce, "ncclReduce"),
		sym(&f.allGather, "ncclAllGather"),
		sym(&f.reduceScatter, "ncclReduceScatter"),
		sym(&f.send, "ncclSend"),
		sym(&f.recv, "ncclRecv"),
		sym(&f.groupStart, "ncclGroupStart"),
		sym(&f.groupEnd, "ncclGroupEnd"),
		optSym(&f.commCount, "ncclCommCount"),
		optSym(&f.commUserRank, "ncclCommUserRank"),
	}
}

// NCCL is the NCCL library, loaded. It is safe for concurrent use and never
// unloaded.
type NCCL struct {
	lib     *library
	fn      ncclFuncs
	version int

	// The two init functions take the unique ID by value (a 128-byte struct),
	// which purego passes on the stack as the C ABI wants.
	initRank       func(comm *uintptr, nranks int32, id ncclUniqueID, rank int32) int32
	initRankConfig func(comm *uintptr, nranks int32, id ncclUniqueID, rank int32, cfg *ncclConfig) int32
}

// NCCLCandidates lists where OpenNCCL looks for libnccl.so.2, in order:
// GEAR_NCCL_LIB alone when it is set; otherwise the loader's search path, then
// nvidia/nccl/lib inside the Python site-packages and dist-packages directories of
// an active virtualenv or conda environment, the user (~/.local) and the system,
// newest Python first.
func NCCLCandidates() []string { return ncclCandidates(buildOptions(nil)) }

func ncclCandidates(o options) []string {
	if o.path != "" {
		return []string{o.path}
	}
	if p := o.getenv(envNCCLLib); p != "" {
		return []string{p}
	}
	out := []string{"libnccl.so.2"}
	var prefixes []string
	for _, env := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if p := o.getenv(env); p != "" {
			prefixes = append(prefixes, p)
		}
	}
	if home := o.getenv("HOME"); home != "" {
		prefixes = append(prefixes, filepath.Join(home, ".local"))
	}
	prefixes = append(prefixes, "/usr/local", "/usr", "/opt/conda")
	seen := map[string]bool{}
	for _, pre := range prefixes {
		var dirs []string
		for _, lib := range []string{"lib", "lib64"} {
			for _, kind := range []string{"site-packages", "dist-packages"} {
				m, _ := filepath.Glob(filepath.Join(pre, lib, "python3*", kind))
				dirs = append(dirs, m...)
			}
		}
		if pre == "/usr" {
			dirs = append(dirs, "/usr/lib/python3/dist-packages")
		}
		sort.SliceStable(dirs, func(i, j int) bool { return pythonMinor(dirs[i]) > pythonMinor(dirs[j]) })
		for _, d := range dirs {
			p := filepath.Join(d, "nvidia", "nccl", "lib", "libnccl.so.2")
			if seen[p] {
				continue
			}
			seen[p] = true
			if _, err := os.Stat(p); err == nil {
				out = append(out, p)
			}
		}
	}
	return out
}

// pythonMinor reads X from a ".../python3.X/..." path (-1 if none).
func pythonMinor(path string) int {
	for _, part := range strings.Split(path, string(filepath.Separator)) {
		if v, ok := strings.CutPrefix(part, "python3."); ok {
			if n, err := strconv.Atoi(v); err == nil {
				return n
			}
		}
	}
	return -1
}

// OpenNCCL loads NCCL from the first of NCCLCandidates that loads. Without one
// the error wraps ErrNoNCCL and lists what was tried.
func OpenNCCL(opts ...Option) (*NCCL, error) {
	o := buildOptions(opts)
	lib, err := openFirst(ncclCandidates(o))
	if err != nil {
		return nil, &wrapped{ErrNoNCCL, err}
	}
	n := &NCCL{lib: lib}
	if err := lib.bind(n.fn.symbols()); err != nil {
		return nil, &wrapped{ErrNoNCCL, err}
	}
	purego.RegisterFunc(&n.initRank, n.fn.commInitRank)
	if n.fn.commInitRankConfig != 0 {
		purego.RegisterFunc(&n.initRankConfig, n.fn.commInitRankConfig)
	}
	var v int32
	if err := n.check("ncclGetVersion", 0, ccall(n.fn.getVersion, uintptr(unsafe.Pointer(&v)))); err != nil {
		return nil, err
	}
	n.version = int(v)
	return n, nil
}

// Path is the library that was loaded.
func (n *NCCL) Path() string { return n.lib.path }

// Version is NCCL's version code: 10000*major + 100*minor + patch (22703 for
// 2.27.3).
func (n *NCCL) Version() int { return n.version }

// NonBlocking reports whether the library has non-blocking communicators
// (ncclCommInitRankConfig, NCCL 2.14 and later), which NCCLComm needs to make
// creation abortable.
func (n *NCCL) NonBlocking() bool { return n.fn.commInitRankConfig != 0 }

func (n *NCCL) check(fn string, comm uintptr, r uintptr) error {
	code := NCCLResult(int32(r))
	if code == NCCLSuccess {
		return nil
	}
	return n.errorOf(fn, comm, code)
}

func (n *NCCL) errorOf(fn string, comm uintptr, code NCCLResult) *NCCLError {
	e := &NCCLError{Func: fn, Code: code, Desc: cString(ccall(n.fn.getErrorString, uintptr(code)))}
	if n.fn.getLastError != 0 {
		e.Last = cString(ccall(n.fn.getLastError, comm))
	}
	return e
}

// NewUniqueID creates the ID of a new communicator (ncclGetUniqueId). Only one
// rank creates it; ShareUniqueID hands it to the others.
func (n *NCCL) NewUniqueID() (UniqueID, error) {
	var id UniqueID
	err := n.check("ncclGetUniqueId", 0, ccall(n.fn.getUniqueID, uintptr(unsafe.Pointer(&id))))
	return id, err
}

// KeyValue is the part of a rank's world that ShareUniqueID needs: its rank and
// the world's write-once key-value exchange. rank.World and
// collective.Bootstrap implement it.
type KeyValue interface {
	Rank() int
	Set(ctx context.Context, key string, value []byte) error
	Wait(ctx context.Context, key string) ([]byte, error)
}

// ShareUniqueID gives every rank of kv the same unique ID under key: rank 0
// creates it and publishes it, every other rank waits for it. Every rank must
// call it with the same key, once per communicator.
func (n *NCCL) ShareUniqueID(ctx context.Context, kv KeyValue, key string) (UniqueID, error) {
	var id UniqueID
	if kv.Rank() == 0 {
		id, err := n.NewUniqueID()
		if err != nil {
			return id, err
		}
		if err := kv.Set(ctx, key, id[:]); err != nil {
			return id, fmt.Errorf("cuda: publishing NCCL unique ID %q: %w", key, err)
		}
		return id, nil
	}
	v, err := kv.Wait(ctx, key)
	if err != nil {
		return id, fmt.Errorf("cuda: waiting for NCCL unique ID %q: %w", key, err)
	}
	if len(v) != len(id) {
		return id, fmt.Errorf("cuda: NCCL unique ID %q has %d bytes, want %d", key, len(v), len(id))
	}
	copy(id[:], v)
	return id, nil
}
