package main

/*
#include <stdint.h>
*/
import "C"

import (
	"context"
	"encoding/json"
	"errors"
	"unsafe"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/rank"
)

// world is a rank's world and its communicator.
type world struct {
	w    *rank.World
	comm *collective.Comm
}

func (w *world) close() error {
	return errors.Join(w.comm.Close(), w.w.Close())
}

// gear_init starts joining the world described by the environment (gearrun's
// or SLURM's; a world of one otherwise) and building its communicator. The
// operation's result is the world's handle.
//
//export gear_init
func gear_init(opOut *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	return start(opOut, func(ctx context.Context) (C.uint64_t, error) {
		w, err := rank.Init(ctx)
		if err != nil {
			return 0, err
		}
		comm, err := w.CommContext(ctx)
		if err != nil {
			w.Close()
			return 0, err
		}
		return register(&world{w: w, comm: comm}), nil
	})
}

// gear_world_info writes the world's facts as JSON into buf (rank, size,
// local_rank, local_size, node_rank, num_nodes, role, role_rank, role_size,
// job_id, host, restart) and their length into n.
//
//export gear_world_info
func gear_world_info(h C.uint64_t, buf *C.char, capacity C.int64_t, n *C.int64_t) (st C.int32_t) {
	defer guard(&st)
	w, err := lookup[*world](h)
	if err != nil {
		return fail(err)
	}
	i := w.w.Info()
	b, err := json.Marshal(map[string]any{
		"rank": i.Rank, "size": i.Size, "local_rank": i.LocalRank, "local_size": i.LocalSize,
		"node_rank": i.NodeRank, "num_nodes": i.NumNodes, "role": i.Role, "role_rank": i.RoleRank,
		"role_size": w.w.RoleSize(), "job_id": i.JobID, "host": w.w.Host(), "restart": i.Restart,
	})
	if err != nil {
		return fail(err)
	}
	copyOut(string(b), buf, capacity, n)
	return statusOK
}

// gear_segment_name writes rank.SegmentName(job, what) into buf: job is the
// world's job ID (GEAR_JOB_ID under gearrun), or this process's local one.
//
//export gear_segment_name
func gear_segment_name(what *C.char, whatLen C.int64_t, buf *C.char, capacity C.int64_t, n *C.int64_t) (st C.int32_t) {
	defer guard(&st)
	info, err := rank.FromEnv()
	if err != nil {
		return fail(err)
	}
	copyOut(rank.SegmentName(info.JobID, gostring(what, whatLen)), buf, capacity, n)
	return statusOK
}

// typed calls f with buf as a slice of the element type dtype names.
func typed(dtype C.int32_t, buf unsafe.Pointer, count C.int64_t,
	f32 func([]float32) error, f64 func([]float64) error, i32 func([]int32) error, i64 func([]int64) error) error {
	if count < 0 || (buf == nil && count > 0) {
		return invalidf("buffer of %d elements at %p", int64(count), buf)
	}
	n := int(count)
	switch dtype {
	case 1:
		return f32(unsafe.Slice((*float32)(buf), n))
	case 2:
		return f64(unsafe.Slice((*float64)(buf), n))
	case 3:
		return i32(unsafe.Slice((*int32)(buf), n))
	case 4:
		return i64(unsafe.Slice((*int64)(buf), n))
	}
	return invalidf("dtype code %d (want GEAR_FLOAT32, GEAR_FLOAT64, GEAR_INT32 or GEAR_INT64)", int32(dtype))
}

func reduceOp(op C.int32_t) (collective.Op, error) {
	switch op {
	case 1:
		return collective.Sum, nil
	case 2:
		return collective.Max, nil
	case 3:
		return collective.Min, nil
	}
	return 0, invalidf("reduction code %d (want GEAR_SUM, GEAR_MAX or GEAR_MIN)", int32(op))
}

// gear_allreduce starts reducing count elements at buf in place across the
// world (collective: every rank calls it in the same order).
//
//export gear_allreduce
func gear_allreduce(h C.uint64_t, buf unsafe.Pointer, count C.int64_t, dtype, op C.int32_t, opOut *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	w, err := lookup[*world](h)
	if err != nil {
		return fail(err)
	}
	o, err := reduceOp(op)
	if err != nil {
		return fail(err)
	}
	return start(opOut, func(ctx context.Context) (C.uint64_t, error) {
		c := w.comm
		return 0, typed(dtype, buf, count,
			func(b []float32) error { return collective.AllReduce(ctx, c, b, o) },
			func(b []float64) error { return collective.AllReduce(ctx, c, b, o) },
			func(b []int32) error { return collective.AllReduce(ctx, c, b, o) },
			func(b []int64) error { return collective.AllReduce(ctx, c, b, o) })
	})
}

// gear_broadcast starts broadcasting count elements at buf from root.
//
//export gear_broadcast
func gear_broadcast(h C.uint64_t, buf unsafe.Pointer, count C.int64_t, dtype, root C.int32_t, opOut *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	w, err := lookup[*world](h)
	if err != nil {
		return fail(err)
	}
	if root < 0 || int(root) >= w.comm.Size() {
		// Refused before the broadcast starts: a collective that fails fails
		// the communicator, for every later call of every rank.
		return fail(invalidf("broadcast root %d: want a rank from 0 to %d", int32(root), w.comm.Size()-1))
	}
	return start(opOut, func(ctx context.Context) (C.uint64_t, error) {
		c, r := w.comm, int(root)
		return 0, typed(dtype, buf, count,
			func(b []float32) error { return collective.Broadcast(ctx, c, b, r) },
			func(b []float64) error { return collective.Broadcast(ctx, c, b, r) },
			func(b []int32) error { return collective.Broadcast(ctx, c, b, r) },
			func(b []int64) error { return collective.Broadcast(ctx, c, b, r) })
	})
}

// gear_allgather starts gathering count elements at send from every rank into
// recv (size*count elements, rank r's at r*count).
//
//export gear_allgather
func gear_allgather(h C.uint64_t, send unsafe.Pointer, count C.int64_t, recv unsafe.Pointer, dtype C.int32_t, opOut *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	w, err := lookup[*world](h)
	if err != nil {
		return fail(err)
	}
	if recv == nil {
		return nullArg("gear_allgather: recv")
	}
	size := C.int64_t(w.comm.Size())
	return start(opOut, func(ctx context.Context) (C.uint64_t, error) {
		c := w.comm
		return 0, typed(dtype, send, count,
			func(b []float32) error {
				return collective.AllGather(ctx, c, b, unsafe.Slice((*float32)(recv), int(size*count)))
			},
			func(b []float64) error {
				return collective.AllGather(ctx, c, b, unsafe.Slice((*float64)(recv), int(size*count)))
			},
			func(b []int32) error {
				return collective.AllGather(ctx, c, b, unsafe.Slice((*int32)(recv), int(size*count)))
			},
			func(b []int64) error {
				return collective.AllGather(ctx, c, b, unsafe.Slice((*int64)(recv), int(size*count)))
			})
	})
}

// gear_barrier starts a barrier over the world's communicator.
//
//export gear_barrier
func gear_barrier(h C.uint64_t, opOut *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	w, err := lookup[*world](h)
	if err != nil {
		return fail(err)
	}
	return start(opOut, func(ctx context.Context) (C.uint64_t, error) {
		return 0, w.comm.Barrier(ctx)
	})
}
