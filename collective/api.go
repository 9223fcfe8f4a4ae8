package collective

import (
	"context"
	"errors"

	"github.com/gear-rl/gear/internal/metrics"
)

// The collectives. Each blocks until this rank's part is done, and takes a
// context: when it ends, the call returns its error. Any error makes the
// communicator fail: the other ranks' calls fail too (naming the cause), and every
// later call returns the same error.
//
// Buffers belong to the caller again when the call returns; no call keeps a
// reference to them.

var errNilComm = errors.New("collective: nil communicator")

// AllReduce replaces buf, on every rank, with the element-wise reduction by op of
// every rank's buf. Every rank passes the same length. All ranks end with
// bit-for-bit equal results.
func AllReduce[T Number](ctx context.Context, c *Comm, buf []T, op Op) error {
	if c == nil {
		return errNilComm
	}
	x, err := c.begin(ctx, header{kind: kindAllReduce, dtype: dtypeOf[T](), op: op, count: uint64(len(buf))})
	if err != nil {
		return err
	}
	m := c.startCall(x, metrics.OpAllReduce)
	return c.end(x, c.observe(m, x, c.allReduce(x, asBytes(buf))))
}

// Reduce replaces root's buf with the element-wise reduction by op of every rank's
// buf; the other ranks' buffers are left as they were.
func Reduce[T Number](ctx context.Context, c *Comm, buf []T, op Op, root int) error {
	if c == nil {
		return errNilComm
	}
	x, err := c.begin(ctx, header{kind: kindReduce, dtype: dtypeOf[T](), op: op, root: uint32(root), count: uint64(len(buf))})
	if err != nil {
		return err
	}
	m := c.startCall(x, metrics.OpReduce)
	return c.end(x, c.observe(m, x, c.reduce(x, asBytes(buf), root)))
}

// Broadcast copies root's buf into every other rank's buf.
func Broadcast[T Elem](ctx context.Context, c *Comm, buf []T, root int) error {
	if c == nil {
		return errNilComm
	}
	x, err := c.begin(ctx, header{kind: kindBroadcast, dtype: dtypeOf[T](), root: uint32(root), count: uint64(len(buf))})
	if err != nil {
		return err
	}
	m := c.startCall(x, metrics.OpBroadcast)
	return c.end(x, c.observe(m, x, c.broadcast(x, asBytes(buf), root)))
}

// AllGather puts every rank's send into recv, rank r's at recv[r*len(send):],
// on every rank. len(recv) is Size()*len(send). send may be recv's block of this
// rank (in place).
func AllGather[T Elem](ctx context.Context, c *Comm, send, recv []T) error {
	if c == nil {
		return errNilComm
	}
	x, err := c.begin(ctx, header{kind: kindAllGather, dtype: dtypeOf[T](), count: uint64(len(send))})
	if err != nil {
		return err
	}
	m := c.startCall(x, metrics.OpAllGather)
	return c.end(x, c.observe(m, x, c.allGather(x, asBytes(send), asBytes(recv))))
}

// Gather puts every rank's send into root's recv, rank r's at recv[r*len(send):].
// recv matters only on root, where len(recv) is Size()*len(send).
func Gather[T Elem](ctx context.Context, c *Comm, send, recv []T, root int) error {
	if c == nil {
		return errNilComm
	}
	x, err := c.begin(ctx, header{kind: kindGather, dtype: dtypeOf[T](), root: uint32(root), count: uint64(len(send))})
	if err != nil {
		return err
	}
	m := c.startCall(x, metrics.OpGather)
	return c.end(x, c.observe(m, x, c.gather(x, asBytes(send), asBytes(recv), root)))
}

// Scatter gives every rank r the block send[r*len(recv):(r+1)*len(recv)] of
// root's send, in recv. send matters only on root.
func Scatter[T Elem](ctx context.Context, c *Comm, send, recv []T, root int) error {
	if c == nil {
		return errNilComm
	}
	x, err := c.begin(ctx, header{kind: kindScatter, dtype: dtypeOf[T](), root: uint32(root), count: uint64(len(recv))})
	if err != nil {
		return err
	}
	m := c.startCall(x, metrics.OpScatter)
	return c.end(x, c.observe(m, x, c.scatter(x, asBytes(send), asBytes(recv), root)))
}

// ReduceScatter reduces every rank's send element-wise by op and gives rank r
// block r of the result in recv. len(send) is Size()*len(recv).
func ReduceScatter[T Number](ctx context.Context, c *Comm, send, recv []T, op Op) error {
	if c == nil {
		return errNilComm
	}
	x, err := c.begin(ctx, header{kind: kindReduceScatter, dtype: dtypeOf[T](), op: op, count: uint64(len(recv))})
	if err != nil {
		return err
	}
	m := c.startCall(x, metrics.OpReduceScatter)
	return c.end(x, c.observe(m, x, c.reduceScatter(x, asBytes(send), asBytes(recv))))
}

// AllToAll sends block j of send to rank j, which puts it at block r (this rank)
// of its recv. Blocks are len(send)/Size() elements; send and recv have the same
// length and must not overlap.
func AllToAll[T Elem](ctx context.Context, c *Comm, send, recv []T) error {
	if c == nil {
		return errNilComm
	}
	x, err := c.begin(ctx, header{kind: kindAllToAll, dtype: dtypeOf[T](), count: uint64(len(send))})
	if err != nil {
		return err
	}
	m := c.startCall(x, metrics.OpAllToAll)
	return c.end(x, c.observe(m, x, c.allToAll(x, asBytes(send), asBytes(recv))))
}

// Send sends buf to rank dst with tag (0 or more). It may return before dst
// receives; messages from one rank with one tag arrive in order. A matching Recv
// must name the same element type and length.
func Send[T Elem](ctx context.Context, c *Comm, buf []T, dst, tag int) error {
	if c == nil {
		return errNilComm
	}
	if tag < 0 {
		return errors.New("collective: Send: negative tag")
	}
	x, err := c.begin(ctx, header{kind: kindP2P, seq: uint64(tag), dtype: dtypeOf[T](), count: uint64(len(buf))})
	if err != nil {
		return err
	}
	m := c.startCall(x, metrics.OpSend)
	return c.end(x, c.observe(m, x, c.sendP2P(x, asBytes(buf), dst)))
}

// Recv receives into buf the next message from rank src with tag; it must have
// buf's element type and length.
func Recv[T Elem](ctx context.Context, c *Comm, buf []T, src, tag int) error {
	if c == nil {
		return errNilComm
	}
	if tag < 0 {
		return errors.New("collective: Recv: negative tag")
	}
	x, err := c.begin(ctx, header{kind: kindP2P, p2p: "Recv", seq: uint64(tag), dtype: dtypeOf[T](), count: uint64(len(buf))})
	if err != nil {
		return err
	}
	m := c.startCall(x, metrics.OpRecv)
	return c.end(x, c.observe(m, x, c.recvP2P(x, asBytes(buf), src)))
}

// SendRecv sends the buffers of send, in order, to rank peer and receives the
// peer's buffers into those of recv, in order, in one call: the peer makes the
// mirror call with the same tag, its send matching this rank's recv buffer for
// buffer in length (and its recv this rank's send). Over TCP both directions
// move at once, on the calling goroutine: many frames per writev straight from
// send, payloads read from the socket straight into recv; elsewhere the lower
// rank sends first. After an error, the contents of recv are undefined until
// the communicator is closed.
//
// Errors: a mismatch (*MismatchError) when the peer's buffers differ in
// length; the communicator's errors.
func SendRecv(ctx context.Context, c *Comm, send, recv [][]byte, peer, tag int) error {
	if c == nil {
		return errNilComm
	}
	if tag < 0 {
		return errors.New("collective: SendRecv: negative tag")
	}
	total := 0
	for _, b := range send {
		total += len(b)
	}
	x, err := c.begin(ctx, header{kind: kindP2P, p2p: "SendRecv", seq: uint64(tag), dtype: Bytes, count: uint64(total)})
	if err != nil {
		return err
	}
	m := c.startCall(x, metrics.OpSendRecv)
	return c.end(x, c.observe(m, x, c.sendRecvP2P(x, peer, send, recv)))
}
