package collective

import "github.com/gear-rl/gear/internal/metrics"

// observe ends call x's metrics, started by metrics.StartCall before begin,
// and passes the call's error on. The public calls wrap their algorithm's
// result in it: return c.end(x, c.observe(m, x, algorithm(...))). Without a
// published metrics segment it is a nil check; with one, an atomic add (see
// package metrics).
func (c *Comm) observe(m metrics.Call, x *call, err error) error {
	m.End(c.id, x.h.seq, int(x.h.count)*x.es)
	return err
}
