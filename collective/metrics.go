package collective

import "github.com/gear-rl/gear/internal/metrics"

// startCall counts call x, of op, in the communicator's metrics (c.met):
// its calls and bytes. The public calls make it right after begin, under
// c.opMu, which makes the call the counters' one writer (see metrics.Comm);
// without a published metrics segment it is a nil check.
func (c *Comm) startCall(x *call, op metrics.Op) metrics.Call {
	return c.met.Start(op, int(x.h.count)*x.es)
}

// observe ends call x's metrics, started by startCall after begin, and
// passes the call's error on. The public calls wrap their algorithm's
// result in it: return c.end(x, c.observe(m, x, algorithm(...))).
func (c *Comm) observe(m metrics.Call, x *call, err error) error {
	m.End(x.h.seq, int(x.h.count)*x.es)
	return err
}
