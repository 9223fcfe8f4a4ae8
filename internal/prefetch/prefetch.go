// Package prefetch asks the CPU for a cache line ahead of a write to it,
// without waiting for the line.
//
// gear's processes meet on shared memory: a row's status line, the commit
// log's cells, the row's blocks. A store, and above all a compare-and-swap,
// to a line that another CPU wrote last waits for the line's move; a loop
// over many such lines waits for each in turn, and a barrier (every
// compare-and-swap is one) waits for the stores before it to find their
// lines. Asked for first, with the intent to write, the lines move together
// and arrive exclusive, while the caller does other work. On a virtual
// machine a move costs from 40 to over 200 ns (internal/cpuline).
//
// Write does not fault, whatever the address: a prefetch of memory that is
// not mapped is dropped. On architectures other than amd64 and arm64 it does
// nothing.
package prefetch
