package main

/*
#include <stdint.h>
*/
import "C"

import (
	"context"
	"unsafe"

	"github.com/gear-rl/gear/roles"
)

type publisher struct{ p *roles.Publisher }

func (p *publisher) close() error { return p.p.Close() }

type reader struct{ r *roles.Reader }

func (r *reader) close() error { return r.r.Close() }

// gear_param_publisher starts opening the parameter service name of world h
// for publishing vectors of n float32s; the operation's result is the
// publisher's handle.
//
//export gear_param_publisher
func gear_param_publisher(h C.uint64_t, name *C.char, nameLen C.int64_t, n C.int64_t, opOut *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	w, err := lookup[*world](h)
	if err != nil {
		return fail(err)
	}
	nm := gostring(name, nameLen)
	return start(opOut, func(ctx context.Context) (C.uint64_t, error) {
		p, err := roles.NewPublisher(ctx, w.w, nm, int(n))
		if err != nil {
			return 0, err
		}
		return register(&publisher{p}), nil
	})
}

// gear_param_publish starts publishing the n float32s at params as version
// (greater than the last one); Publish copies them.
//
//export gear_param_publish
func gear_param_publish(h C.uint64_t, version C.uint64_t, params *C.float, n C.int64_t, opOut *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	p, err := lookup[*publisher](h)
	if err != nil {
		return fail(err)
	}
	if params == nil || n < 0 {
		return fail(invalidf("parameters: %d floats at %p", int64(n), params))
	}
	v := unsafe.Slice((*float32)(unsafe.Pointer(params)), int(n))
	return start(opOut, func(ctx context.Context) (C.uint64_t, error) {
		return 0, p.p.Publish(ctx, uint64(version), v)
	})
}

// gear_param_reader starts opening the parameter service name of world h for
// reading (it waits for the publisher); the operation's result is the
// reader's handle.
//
//export gear_param_reader
func gear_param_reader(h C.uint64_t, name *C.char, nameLen C.int64_t, opOut *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	w, err := lookup[*world](h)
	if err != nil {
		return fail(err)
	}
	nm := gostring(name, nameLen)
	return start(opOut, func(ctx context.Context) (C.uint64_t, error) {
		r, err := roles.NewReader(ctx, w.w, nm, 1)
		if err != nil {
			return 0, err
		}
		return register(&reader{r}), nil
	})
}

// gear_param_len stores the length of the service's vectors in n.
//
//export gear_param_len
func gear_param_len(h C.uint64_t, n *C.int64_t) (st C.int32_t) {
	defer guard(&st)
	if n == nil {
		return nullArg("gear_param_len: n")
	}
	r, err := lookup[*reader](h)
	if err != nil {
		return fail(err)
	}
	*n = C.int64_t(r.r.Len())
	return statusOK
}

// gear_param_read waits up to ms milliseconds for a version of at least min
// (GEAR_TIMEOUT then), takes the newest, and copies it into dst (n floats, the
// service's length) and its version into version. With min 0 it takes what
// is there now (version 0 and nothing copied when nothing was published).
//
//export gear_param_read
func gear_param_read(h C.uint64_t, min C.uint64_t, ms C.int64_t, dst *C.float, n C.int64_t, version *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	if version == nil {
		return nullArg("gear_param_read: version")
	}
	r, err := lookup[*reader](h)
	if err != nil {
		return fail(err)
	}
	if dst == nil || int(n) != r.r.Len() {
		return fail(invalidf("parameters: a buffer of %d floats for vectors of %d", int64(n), r.r.Len()))
	}
	ctx, cancel := timeoutCtx(ms)
	defer cancel()
	var v uint64
	if min == 0 {
		v, err = r.r.Latest(ctx)
	} else {
		v, err = r.r.Wait(ctx, uint64(min))
	}
	if err != nil {
		return fail(err)
	}
	if v > 0 {
		copy(unsafe.Slice((*float32)(unsafe.Pointer(dst)), int(n)), r.r.Params())
	}
	*version = C.uint64_t(v)
	return statusOK
}
