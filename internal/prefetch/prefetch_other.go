//go:build !amd64 && !arm64

package prefetch

import "unsafe"

// Write asks for p's cache line, to be written (nothing on this architecture).
func Write(p unsafe.Pointer) {}
