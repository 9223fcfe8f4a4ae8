// Command libgear is gear's C ABI: built with
//
//	go build -buildmode=c-shared -o libgear.so ./cmd/libgear
//
// it gives a shared library and its header (gear.h, written beside it), which
// the Python package (python/gear) loads with ctypes. It is the only package of
// the module that uses cgo; it adds no logic of its own to the packages it
// exposes (rank, collective, store, sample, roles, and jobs for the [table]
// vocabulary).
//
// # The calls
//
// Every call returns an int32 status: GEAR_OK (0), GEAR_ERROR, GEAR_CLOSED,
// GEAR_TIMEOUT, GEAR_INVALID (a bad argument or a value the Go packages refuse),
// or GEAR_PENDING (gear_op_wait only: the operation goes on). After a status
// other than GEAR_OK and GEAR_PENDING, gear_last_error copies the whole Go error
// text of the calling thread's last failed call. No call panics across the
// boundary: a panic becomes GEAR_ERROR with its message.
//
// Objects (a world, a table, a writer, a batch, a parameter publisher or reader,
// an operation) are uint64 handles; gear_close frees any of them (a table
// closes its table and shard, a world its communicator and world). A call on a
// freed handle returns GEAR_CLOSED.
//
// Blocking calls come in two kinds. The table calls that wait (allocating a
// row in a full shard, sampling under a rate limiter) take a timeout in
// milliseconds and return GEAR_TIMEOUT, having changed nothing, when it passes:
// a caller that must stay responsive calls them in short slices. The calls that
// cannot be sliced (init, collectives, checkpoints, parameter publication)
// start an operation (an op handle): gear_op_wait(op, ms) waits for it a while
// (GEAR_PENDING while it goes on, else its status), gear_op_cancel(op) ends its
// context, gear_op_result gives the handle it made. Buffers passed to an
// operation belong to it until gear_op_wait has returned something other than
// GEAR_PENDING.
//
// # Memory
//
// gear_shard_layout describes the shard's mapping: its address in this process
// and each column table's offset within it. The mapping is shared memory that
// stays mapped until the table or writer handle is freed, so views of it (numpy
// arrays) are valid until then, and no longer.
package main

/*
#include <stdint.h>

#define GEAR_OK 0
#define GEAR_ERROR 1
#define GEAR_CLOSED 2
#define GEAR_TIMEOUT 3
#define GEAR_INVALID 4
#define GEAR_PENDING 5

#define GEAR_FLOAT32 1
#define GEAR_FLOAT64 2
#define GEAR_INT32 3
#define GEAR_INT64 4

#define GEAR_SUM 1
#define GEAR_MAX 2
#define GEAR_MIN 3
*/
import "C"

func main() {}
