package cuda

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Environment variables read when a library is opened. Their names are part of
// the launcher-to-rank contract and equal rank.EnvCUDALib and rank.EnvNCCLLib (a
// test checks it); package cuda does not import rank, which sits above it.
const (
	envCUDALib = "GEAR_CUDA_LIB"
	envNCCLLib = "GEAR_NCCL_LIB"
)

// Option changes how OpenDriver or OpenNCCL finds its library.
type Option func(*options)

type options struct {
	path   string
	getenv func(string) string
}

// WithLibrary opens the library at path (or a bare soname, searched by the
// loader) instead of searching: no environment variable and no fallback.
func WithLibrary(path string) Option {
	return func(o *options) { o.path = path }
}

func buildOptions(opts []Option) options {
	o := options{getenv: os.Getenv}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// library is a dlopen'ed shared object.
type library struct {
	path   string
	handle uintptr
}

// openFirst opens the first candidate that loads. The error lists every attempt.
func openFirst(candidates []string) (*library, error) {
	var msgs []string
	for _, c := range candidates {
		h, err := purego.Dlopen(c, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err == nil {
			return &library{path: c, handle: h}, nil
		}
		msgs = append(msgs, err.Error())
	}
	if len(msgs) == 0 {
		return nil, errors.New("no candidate paths")
	}
	return nil, errors.New(strings.Join(msgs, "; "))
}

// symbol is one function to look up: the first of names that the library
// exports is stored in *fn. A missing optional symbol leaves *fn zero.
type symbol struct {
	fn       *uintptr
	optional bool
	names    []string
}

func sym(fn *uintptr, names ...string) symbol { return symbol{fn: fn, names: names} }
func optSym(fn *uintptr, names ...string) symbol {
	return symbol{fn: fn, optional: true, names: names}
}

// bind looks every symbol up by its exported name.
func (l *library) bind(syms []symbol) error {
	var missing []string
	for _, s := range syms {
		*s.fn = 0
		for _, name := range s.names {
			if p, err := purego.Dlsym(l.handle, name); err == nil && p != 0 {
				*s.fn = p
				break
			}
		}
		if *s.fn == 0 && !s.optional {
			missing = append(missing, s.names[0])
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s lacks %s", l.path, strings.Join(missing, ", "))
	}
	return nil
}

// ccall calls the C function fn. Arguments that are pointers converted to
// uintptr in the call expression are kept alive and on the heap for the call.
//
//go:uintptrescapes
func ccall(fn uintptr, args ...uintptr) uintptr {
	r, _, _ := purego.SyscallN(fn, args...)
	return r
}

// cString copies the NUL-terminated C string at p (at most 64 KiB of it).
func cString(p uintptr) string {
	if p == 0 {
		return ""
	}
	base := *(*unsafe.Pointer)(unsafe.Pointer(&p))
	n := 0
	for n < 1<<16 && *(*byte)(unsafe.Add(base, n)) != 0 {
		n++
	}
	return string(unsafe.Slice((*byte)(base), n))
}

// ptrString is cString for a C string stored through a const char** out-argument.
func ptrString(p unsafe.Pointer) string {
	if p == nil {
		return ""
	}
	n := 0
	for n < 1<<16 && *(*byte)(unsafe.Add(p, n)) != 0 {
		n++
	}
	return string(unsafe.Slice((*byte)(p), n))
}
