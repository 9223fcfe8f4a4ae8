package collective

import (
	"context"
	"fmt"
	"slices"
	"unsafe"

	"github.com/gear-rl/gear/internal/metrics"
)

// The collectives on bytes: argument checks and the choice of algorithm. The
// generic functions in api.go call these.

func (c *Comm) all() group { return c.group }

// hierarchical reports whether the ranks span hosts with more than one rank on
// some host: then AllReduce reduces within hosts, across one leader per host, and
// broadcasts back.
func (c *Comm) hierarchical() bool {
	if len(c.hosts) < 2 {
		return false
	}
	for _, h := range c.hosts {
		if len(h) > 1 {
			return true
		}
	}
	return false
}

func (c *Comm) checkOp(x *call, op Op) error {
	if !op.valid() {
		return x.argError("unknown reduction %v", op)
	}
	return nil
}

func (c *Comm) checkRoot(x *call, root int) error {
	if root < 0 || root >= c.size {
		return x.argError("root %d out of range for %d ranks", root, c.size)
	}
	return nil
}

func (c *Comm) allReduce(x *call, buf []byte) error {
	if err := c.checkOp(x, x.h.op); err != nil {
		return err
	}
	if c.size == 1 {
		return nil
	}
	if c.boardMax > 0 && len(buf) <= c.boardMax && x.k != nil {
		x.h.algo = algoBoard
		return c.board.boardCall(x.ctx, x.h, x.k, buf)
	}
	small := len(buf) <= min(c.cfg.tuning.SmallAllReduce, c.chunk)
	if c.hierarchical() {
		x.h.algo = algoHier
		return c.hierAllReduce(x, buf, small)
	}
	if small {
		x.h.algo = algoRecDoubling
		return rdAllReduce(x, c.all(), buf)
	}
	if c.overTCP() {
		x.h.algo = algoHalving
		return halvingAllReduce(x, c.all(), buf)
	}
	x.h.algo = algoRing
	return ringAllReduce(x, c.all(), buf)
}

// overTCP reports whether the communicator's ranks talk TCP: every rank on a
// host of its own, or TCP asked for. Every rank computes the same.
func (c *Comm) overTCP() bool {
	return c.cfg.loopback == nil && (c.cfg.transport == TransportTCP || len(c.hosts) == c.size || !shmAvailable())
}

// hierAllReduce: reduce to the first rank of every host, allreduce among those
// leaders, broadcast back within every host. The three phases number their frames
// apart.
func (c *Comm) hierAllReduce(x *call, buf []byte, small bool) error {
	h := c.hosts[c.hostOf[c.rank]]
	host := group{ranks: h, me: slices.Index(h, c.rank)}
	leaders := group{me: -1}
	for i, hr := range c.hosts {
		leaders.ranks = append(leaders.ranks, hr[0])
		if hr[0] == c.rank {
			leaders.me = i
		}
	}
	bcastSmall := host.n() >= treeMinRanks && len(buf) <= min(c.cfg.tuning.SmallBroadcast, c.chunk)
	if host.n() > 1 {
		x.base = 0
		var err error
		if bcastSmall {
			err = treeReduce(x, host, buf, 0, true)
		} else {
			err = chainReduce(x, host, buf, 0)
		}
		if err != nil {
			return err
		}
	}
	if leaders.me >= 0 {
		x.base = 1 << 20
		var err error
		// The leaders are on different hosts: TCP's algorithms.
		if small {
			err = rdAllReduce(x, leaders, buf)
		} else {
			err = halvingAllReduce(x, leaders, buf)
		}
		if err != nil {
			return err
		}
	}
	if host.n() > 1 {
		x.base = 2 << 20
		if bcastSmall {
			return treeBroadcast(x, host, buf, 0)
		}
		return chainBroadcast(x, host, buf, 0)
	}
	return nil
}

// treeMinRanks: below this many ranks the pipelined chain was as fast as the
// binomial tree at every size measured (docs/collectives.md), so the tree only
// serves larger communicators, where its log2(n) hops beat the chain's n-1.
const treeMinRanks = 5

func (c *Comm) useTree(bytes int) bool {
	return c.size >= treeMinRanks && bytes <= min(c.cfg.tuning.SmallBroadcast, c.chunk)
}

func (c *Comm) broadcast(x *call, buf []byte, root int) error {
	if err := c.checkRoot(x, root); err != nil {
		return err
	}
	if c.size == 1 {
		return nil
	}
	if c.useTree(len(buf)) {
		x.h.algo = algoTree
		return treeBroadcast(x, c.all(), buf, root)
	}
	x.h.algo = algoChain
	return chainBroadcast(x, c.all(), buf, root)
}

func (c *Comm) reduce(x *call, buf []byte, root int) error {
	if err := c.checkOp(x, x.h.op); err != nil {
		return err
	}
	if err := c.checkRoot(x, root); err != nil {
		return err
	}
	if c.size == 1 {
		return nil
	}
	if c.useTree(len(buf)) {
		x.h.algo = algoTree
		return treeReduce(x, c.all(), buf, root, false)
	}
	x.h.algo = algoChain
	return chainReduce(x, c.all(), buf, root)
}

// overlaps reports whether two byte slices share memory.
func overlaps(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0, b0 := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return a0 < b0+uintptr(len(b)) && b0 < a0+uintptr(len(a))
}

// same reports whether a and b are the same memory.
func same(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// checkBlocks checks the arguments of a call that splits one buffer into a
// block per rank: whole (named wholeName in errors) must hold c.size blocks of
// len(block) bytes, and block (blockName) may share memory with whole only as
// whole's block at index at (whose: "this rank's", "the root's").
func (c *Comm) checkBlocks(x *call, wholeName string, whole []byte, blockName string, block []byte, at int, whose string) error {
	b := len(block)
	if len(whole) != b*c.size {
		return x.argError("%s has %d elements, want %d (%d ranks x %d)", wholeName, len(whole)/x.es, b*c.size/x.es, c.size, b/x.es)
	}
	if !same(whole[at*b:(at+1)*b], block) && overlaps(block, whole) {
		return x.argError("%s overlaps %s other than at %s block", blockName, wholeName, whose)
	}
	return nil
}

func (c *Comm) allGather(x *call, send, recv []byte) error {
	if err := c.checkBlocks(x, "recv", recv, "send", send, c.rank, "this rank's"); err != nil {
		return err
	}
	b := len(send)
	if own := recv[c.rank*b : (c.rank+1)*b]; !same(own, send) {
		copy(own, send)
	}
	if c.size == 1 {
		return nil
	}
	x.h.algo = algoRing
	return ringAllGather(x, c.all(), recv, b)
}

func (c *Comm) gather(x *call, send, recv []byte, root int) error {
	if err := c.checkRoot(x, root); err != nil {
		return err
	}
	if c.rank == root {
		if err := c.checkBlocks(x, "recv", recv, "send", send, root, "the root's"); err != nil {
			return err
		}
	}
	if c.size == 1 {
		copy(recv, send)
		return nil
	}
	x.h.algo = algoLinear
	return linearGather(x, c.all(), send, recv, root)
}

func (c *Comm) scatter(x *call, send, recv []byte, root int) error {
	if err := c.checkRoot(x, root); err != nil {
		return err
	}
	if c.rank == root {
		if err := c.checkBlocks(x, "send", send, "recv", recv, root, "the root's"); err != nil {
			return err
		}
	}
	if c.size == 1 {
		copy(recv, send)
		return nil
	}
	x.h.algo = algoLinear
	return linearScatter(x, c.all(), send, recv, root)
}

func (c *Comm) reduceScatter(x *call, send, recv []byte) error {
	if err := c.checkOp(x, x.h.op); err != nil {
		return err
	}
	if err := c.checkBlocks(x, "send", send, "recv", recv, c.rank, "this rank's"); err != nil {
		return err
	}
	x.h.algo = algoRing
	return ringReduceScatter(x, c.all(), send, recv)
}

func (c *Comm) allToAll(x *call, send, recv []byte) error {
	if len(send) != len(recv) || len(send)%(c.size*x.es) != 0 {
		return x.argError("send and recv have %d and %d elements, want equal multiples of %d ranks", len(send)/x.es, len(recv)/x.es, c.size)
	}
	if overlaps(send, recv) {
		return x.argError("send and recv overlap")
	}
	x.h.algo = algoPairwise
	return pairwiseAllToAll(x, c.all(), send, recv)
}

// Barrier returns once every rank of the communicator has called it.
func (c *Comm) Barrier(ctx context.Context) error {
	x, err := c.begin(ctx, header{kind: kindBarrier, dtype: Bytes})
	if err != nil {
		return err
	}
	m := c.startCall(x, metrics.OpBarrier)
	return c.end(x, c.observe(m, x, c.barrier(x)))
}

// barrier is the dissemination barrier, also where the communicator has a
// board: a Barrier on frames meets the frames a mismatched call left behind
// (a Broadcast whose ranks named other roots) on every rank, where a board
// Barrier could let a rank through before such a frame reached it
// (docs/collectives.md, "The board").
func (c *Comm) barrier(x *call) error {
	x.h.algo = algoDissemination
	return dissemination(x, c.all())
}

// send and recv: point to point, matched by (peer, tag), not numbered.
func (c *Comm) sendP2P(x *call, buf []byte, dst int) error {
	if dst < 0 || dst >= c.size || dst == c.rank {
		return x.argError("destination %d: want another rank of %d", dst, c.size)
	}
	return x.sendPieces(dst, buf)
}

func (c *Comm) recvP2P(x *call, buf []byte, src int) error {
	if src < 0 || src >= c.size || src == c.rank {
		return x.argError("source %d: want another rank of %d", src, c.size)
	}
	in := &c.in[src]
	for k := range x.pieces(len(buf)) {
		dst := x.piece(buf, k)
		p, err := c.nextTagged(x, in, src)
		if err != nil {
			return err
		}
		if err := x.checkP2P(src, &p.h, uint32(k), len(dst)); err != nil {
			return err
		}
		copy(dst, p.buf)
		in.release(c.pool)
	}
	return nil
}

// nextTagged finds the next frame from src with the call's tag, stashing the
// frames of other tags and of collectives that come before it.
func (c *Comm) nextTagged(x *call, in *inbox, src int) (qframe, error) {
	for i := range in.stash {
		f := in.stash[i]
		if f.h.kind == kindP2P && f.h.seq == x.h.seq {
			in.held, in.stashIndex = heldStash, i
			return f, nil
		}
	}
	for {
		h, p, err := in.l.next(x.ctx)
		if err != nil {
			return qframe{}, err
		}
		if h.kind == kindP2P && h.seq == x.h.seq {
			in.held = heldLink
			return qframe{h: h, buf: p}, nil
		}
		in.keep(c.pool, h, p)
		in.l.release()
	}
}

func (x *call) checkP2P(src int, h *header, step uint32, n int) error {
	if h.dtype != x.h.dtype || h.count != x.h.count {
		return &MismatchError{Rank: x.c.rank, Call: recvDesc(&x.h), PeerRank: src, PeerCall: h.describe()}
	}
	if h.step != step || int(h.n) != n {
		return &MismatchError{Rank: x.c.rank, Call: recvDesc(&x.h), PeerRank: src, PeerCall: h.describe(),
			Detail: fmt.Sprintf("got frame %d of %d bytes, want frame %d of %d bytes", h.step, h.n, step, n)}
	}
	return nil
}

func recvDesc(h *header) string {
	r := *h
	r.p2p = "Recv"
	return r.describe()
}

// postLink is a link that reads the payload of an expected frame straight into
// the caller's memory (TCP: from the socket), instead of into a buffer of its own.
type postLink interface {
	postRecv(dst []byte, match func(h *header) bool)
	unpostRecv()
}

// hasTagged reports whether the stash holds a point-to-point frame with tag.
func (in *inbox) hasTagged(tag uint64) bool {
	for i := range in.stash {
		if in.stash[i].h.kind == kindP2P && in.stash[i].h.seq == tag {
			return true
		}
	}
	return false
}

// sendRecvP2P sends the buffers of send to peer and receives the peer's into
// recv, frame by frame: frames are numbered across the buffers, and each buffer
// starts a new frame, so that the peer's send and this rank's recv must match
// buffer for buffer. Over TCP both ways move at once (swapTCP); elsewhere the
// lower rank sends first. (Sending on a goroutine of the call while it
// receives was slower than one way at a time over loopback TCP on 2 cores:
// three threads per rank took turns on the cores.)
func (c *Comm) sendRecvP2P(x *call, peer int, send, recv [][]byte) error {
	if peer < 0 || peer >= c.size || peer == c.rank {
		return x.argError("peer %d: want another rank of %d", peer, c.size)
	}
	want := 0
	for _, b := range recv {
		want += len(b)
	}
	ctx := x.ctx
	sendAll := func() error {
		step := uint32(0)
		l := c.links[peer]
		for _, b := range send {
			for k := range x.pieces(len(b)) {
				p := x.piece(b, k)
				h := x.frame(step, len(p))
				var err error
				if d, ok := l.(directLink); ok {
					err = d.sendFrom(ctx, h, p)
				} else {
					var out []byte
					if out, err = l.reserve(ctx, len(p)); err == nil {
						copy(out, p)
						err = l.commit(ctx, h)
					}
				}
				if err != nil {
					return err
				}
				step++
			}
		}
		return nil
	}
	recvAll := func() error {
		in := &c.in[peer]
		step := uint32(0)
		for _, b := range recv {
			for k := range x.pieces(len(b)) {
				dst := x.piece(b, k)
				posted := false
				if pl, ok := in.l.(postLink); ok && !in.hasTagged(x.h.seq) {
					tag, s, total := x.h.seq, step, uint64(want)
					pl.postRecv(dst, func(h *header) bool {
						return h.kind == kindP2P && h.seq == tag && h.step == s && h.count == total && h.dtype == Bytes
					})
					posted = true
				}
				f, err := c.nextTagged(x, in, peer)
				if posted {
					in.l.(postLink).unpostRecv()
				}
				if err != nil {
					return err
				}
				if f.h.dtype != Bytes || f.h.count != uint64(want) || f.h.step != step || int(f.h.n) != len(dst) {
					in.release(c.pool)
					return &MismatchError{Rank: c.rank, Call: fmt.Sprintf("SendRecv(receiving %d bytes, tag %d)", want, int64(x.h.seq)), PeerRank: peer, PeerCall: f.h.describe(),
						Detail: fmt.Sprintf("got frame %d of %d bytes, want frame %d of %d bytes", f.h.step, f.h.n, step, len(dst))}
				}
				copy(dst, f.buf)
				in.release(c.pool)
				step++
			}
		}
		return nil
	}
	if tl, ok := c.links[peer].(*tcpLink); ok {
		return c.swapTCP(x, tl, peer, send, recv, want)
	}
	if c.rank < peer {
		if err := sendAll(); err != nil {
			return err
		}
		return recvAll()
	}
	if err := recvAll(); err != nil {
		return err
	}
	return sendAll()
}

// swapTCP is sendRecvP2P over a TCP link, both ways at once on this
// goroutine: it writes as much as the socket takes, many frames per writev,
// reads what has come (payloads straight into recv), and sleeps in poll(2)
// until either way can move again.
func (c *Comm) swapTCP(x *call, l *tcpLink, peer int, send, recv [][]byte, want int) error {
	var outs []outFrame
	step := uint32(0)
	for _, b := range send {
		for k := range x.pieces(len(b)) {
			p := x.piece(b, k)
			outs = append(outs, outFrame{p: p})
			h := x.frame(step, len(p))
			h.encode(outs[len(outs)-1].h[:])
			step++
		}
	}
	var dsts [][]byte
	for _, b := range recv {
		for k := range x.pieces(len(b)) {
			dsts = append(dsts, x.piece(b, k))
		}
	}
	in := &c.in[peer]
	tag := x.h.seq
	si, off, ri := 0, 0, 0
	posted := false
	defer func() {
		if posted {
			l.unpostRecv()
		}
	}()
	for si < len(outs) || ri < len(dsts) {
		progress := false
		if si < len(outs) {
			n, err := l.writeFrames(outs[si:], off)
			if err != nil {
				return err
			}
			progress = n > 0
			for n > 0 {
				left := headerSize + len(outs[si].p) - off
				if n < left {
					off += n
					break
				}
				n -= left
				si, off = si+1, 0
			}
		}
		for ri < len(dsts) {
			dst := dsts[ri]
			s := uint32(ri)
			if !posted && len(dst) >= postMin && !in.hasTagged(tag) {
				l.postRecv(dst, func(h *header) bool {
					return h.kind == kindP2P && h.seq == tag && h.step == s && h.count == uint64(want) && h.dtype == Bytes
				})
				posted = true
			}
			f, ok, err := c.tryTagged(x, in, l, peer)
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			if posted {
				l.unpostRecv()
				posted = false
			}
			if f.h.dtype != Bytes || f.h.count != uint64(want) || f.h.step != s || int(f.h.n) != len(dst) {
				in.release(c.pool)
				return &MismatchError{Rank: c.rank, Call: fmt.Sprintf("SendRecv(receiving %d bytes, tag %d)", want, int64(tag)), PeerRank: peer, PeerCall: f.h.describe(),
					Detail: fmt.Sprintf("got frame %d of %d bytes, want frame %d of %d bytes", f.h.step, f.h.n, s, len(dst))}
			}
			if !same(f.buf, dst) {
				copy(dst, f.buf)
			}
			in.release(c.pool)
			ri++
			progress = true
		}
		if progress {
			continue
		}
		if c.sig.failed.Load() {
			return errStopped
		}
		if err := x.ctx.Err(); err != nil {
			return err
		}
		if err := l.waitIO(si < len(outs)); err != nil {
			return err
		}
	}
	return nil
}

// tryTagged is nextTagged without waiting: the next frame from src with the
// call's tag, if it has come.
func (c *Comm) tryTagged(x *call, in *inbox, l *tcpLink, src int) (qframe, bool, error) {
	for i := range in.stash {
		f := in.stash[i]
		if f.h.kind == kindP2P && f.h.seq == x.h.seq {
			in.held, in.stashIndex = heldStash, i
			return f, true, nil
		}
	}
	for {
		h, p, ok, err := l.tryNext()
		if err != nil || !ok {
			return qframe{}, false, err
		}
		if h.kind == kindP2P && h.seq == x.h.seq {
			in.held = heldLink
			return qframe{h: h, buf: p}, true, nil
		}
		in.keep(c.pool, h, p)
		l.release()
	}
}
