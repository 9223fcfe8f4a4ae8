package prefetch_test

import (
	"bytes"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/internal/prefetch"
)

// A prefetch changes no byte of the memory it asks for.
func TestLeavesMemoryAlone(t *testing.T) {
	buf := make([]byte, 4096)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	want := bytes.Clone(buf)
	for off := 0; off < len(buf); off += 8 {
		prefetch.Write(unsafe.Pointer(&buf[off]))
	}
	if !bytes.Equal(buf, want) {
		t.Fatal("a prefetch changed the memory it asked for")
	}
}

// A prefetch of memory that is not mapped, or of nil, is dropped: a caller
// may ask for a row it has not checked yet.
func TestNeverFaults(t *testing.T) {
	page := uintptr(unix.Getpagesize())
	base, err := unix.MmapPtr(-1, 0, nil, 2*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.MunmapPtr(base, page)
	gone := unsafe.Add(base, page)
	if err := unix.MunmapPtr(gone, page); err != nil {
		t.Fatal(err)
	}
	last := unsafe.Add(base, page-1)
	for _, p := range []unsafe.Pointer{nil, gone, last} {
		prefetch.Write(p)
	}
	*(*byte)(last) = 1 // the page still mapped is still writable
}
