package main

/*
#include <stdint.h>
*/
import "C"

import (
	"context"
	"errors"
	"time"

	"github.com/gear-rl/gear/internal/cpuline"
)

// gear_line_latency starts timing rounds hand-overs of one cache line between
// the first two CPUs this process may run on (internal/cpuline: what gear's
// writer processes meet on); the operation's result is the mean hand-over in
// picoseconds. A process that may run on one CPU, or whose Go code runs on
// one thread at a time (GOMAXPROCS=1), gets GEAR_INVALID.
//
//export gear_line_latency
func gear_line_latency(rounds C.int64_t, opOut *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	if rounds < 8 {
		return fail(invalidf("line latency: %d rounds: want at least 8", int64(rounds)))
	}
	return start(opOut, func(ctx context.Context) (C.uint64_t, error) {
		r, err := cpuline.Measure(ctx, int(rounds))
		if errors.Is(err, cpuline.ErrOneCPU) {
			return 0, invalidf("line latency: %v", err)
		}
		if err != nil {
			return 0, err
		}
		return C.uint64_t(r.Took * 1000 / time.Duration(r.Rounds) / time.Nanosecond), nil
	})
}
