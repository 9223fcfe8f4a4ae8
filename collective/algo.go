package collective

// The algorithms. Each runs on a group (an ordered subset of the communicator's
// ranks), moves at most one chunk per frame, and keeps every rank at most one frame
// ahead of what it has received in a cycle of ranks, so that shared-memory rings of
// a few chunks never fill up all around a ring of ranks.

// group is an ordered subset of a communicator's ranks.
type group struct {
	ranks []int
	me    int // this rank's index in ranks
}

func (g group) n() int { return len(g.ranks) }

// at returns the rank at index i, modulo the group size.
func (g group) at(i int) int {
	n := len(g.ranks)
	return g.ranks[((i%n)+n)%n]
}

func mod(i, n int) int { return ((i % n) + n) % n }

// part returns part j (modulo parts) of total elements split as evenly as possible:
// the half-open element range [lo, hi).
func part(total, parts, j int) (lo, hi int) {
	j = mod(j, parts)
	return total * j / parts, total * (j + 1) / parts
}

// pieces is how many frames a block of n bytes needs: at least one.
func (x *call) pieces(n int) int {
	if n <= x.chunk {
		return 1
	}
	return (n + x.chunk - 1) / x.chunk
}

// piece returns piece k of block b.
func (x *call) piece(b []byte, k int) []byte {
	lo := min(k*x.chunk, len(b))
	return b[lo:min(lo+x.chunk, len(b))]
}

// recvCopy receives frame step of len(dst) bytes from rank from into dst.
func (x *call) recvCopy(from int, step uint32, dst []byte) error {
	posted := x.post(from, step, dst)
	in, err := x.recv(from, step, len(dst))
	if posted {
		x.c.in[from].l.(postLink).unpostRecv()
	}
	if err != nil {
		return err
	}
	if !same(in, dst) {
		copy(dst, in)
	}
	x.release(from)
	return nil
}

// postMin: smaller frames are read through the link's own buffers (a lone
// header read costs a system call more).
const postMin = 16 << 10

// post asks a link that can (TCP) to read the payload of frame step from rank
// from straight into dst, if that frame is still unread; the caller unposts
// once it has the frame. Not while frames of collectives wait in the stash:
// the frame might be among them.
func (x *call) post(from int, step uint32, dst []byte) bool {
	if len(dst) < postMin {
		return false
	}
	in := &x.c.in[from]
	pl, ok := in.l.(postLink)
	if !ok {
		return false
	}
	for i := range in.stash {
		if in.stash[i].h.kind != kindP2P {
			return false
		}
	}
	want := x.frame(step, len(dst))
	pl.postRecv(dst, func(h *header) bool {
		return h.sameCall(&want) && h.algo == want.algo && h.step == want.step && h.n == want.n
	})
	return true
}

// sendPieces sends b to rank to as frames 0, 1, ... of at most a chunk each;
// recvPieces receives such frames from rank from into b.
func (x *call) sendPieces(to int, b []byte) error {
	for k := range x.pieces(len(b)) {
		if err := x.send(to, uint32(k), x.piece(b, k)); err != nil {
			return err
		}
	}
	return nil
}

func (x *call) recvPieces(from int, b []byte) error {
	for k := range x.pieces(len(b)) {
		if err := x.recvCopy(from, uint32(k), x.piece(b, k)); err != nil {
			return err
		}
	}
	return nil
}

// relay receives frame step of len(dst) bytes from rank from and copies it into
// dst; with pass, it also sends the frame on to rank to as frame next, straight
// from the receive buffer.
func (x *call) relay(from int, step uint32, dst []byte, to int, next uint32, pass bool) error {
	if !pass {
		return x.recvCopy(from, step, dst)
	}
	posted := x.post(from, step, dst)
	in, err := x.recv(from, step, len(dst))
	if posted {
		x.c.in[from].l.(postLink).unpostRecv()
	}
	if err != nil {
		return err
	}
	if !same(in, dst) {
		copy(dst, in)
	}
	if _, ok := x.c.links[to].(directLink); ok {
		x.release(from)
		return x.send(to, next, dst)
	}
	out, err := x.reserve(to, len(dst))
	if err != nil {
		return err
	}
	x.toFrame(out, in)
	x.release(from)
	return x.commit(to, next, len(dst))
}

// ringAllReduce is the bandwidth-optimal AllReduce: a reduce-scatter then an
// allgather around the ring, in rounds of one chunk per rank. Each step receives a
// chunk from the left, reduces it with this rank's data straight into the frame
// for the right (a shared-memory ring receives the sum in place), and sends it on.
func ringAllReduce(x *call, g group, buf []byte) error {
	n := g.n()
	if n == 1 {
		return nil
	}
	es := x.es
	count := len(buf) / es
	left, right := g.at(g.me-1), g.at(g.me+1)
	per := x.chunk / es
	round := per * n
	for base := 0; base < count; base += round {
		m := min(round, count-base)
		seg := func(j int) []byte {
			lo, hi := part(m, n, j)
			return buf[(base+lo)*es : (base+hi)*es]
		}
		if err := x.send(right, 0, seg(g.me)); err != nil {
			return err
		}
		// Reduce-scatter: after n-1 steps this rank holds segment me+1 reduced.
		for s := 0; s < n-1; s++ {
			mine := seg(g.me - s - 1)
			in, err := x.recv(left, uint32(s), len(mine))
			if err != nil {
				return err
			}
			out, err := x.reserve(right, len(mine))
			if err != nil {
				return err
			}
			if s < n-2 {
				x.redFrame(out, in, mine)
			} else {
				x.k(mine, in, mine)
				x.toFrame(out, mine)
			}
			x.release(left)
			if err := x.commit(right, uint32(s+1), len(mine)); err != nil {
				return err
			}
		}
		// Allgather: pass the reduced segments on around the ring.
		for s := 0; s < n-1; s++ {
			if err := x.relay(left, uint32(n-1+s), seg(g.me-s), right, uint32(n+s), s < n-2); err != nil {
				return err
			}
		}
	}
	return nil
}

// rdAllReduce is the latency-optimal AllReduce for small buffers (at most one
// chunk): recursive doubling, with the ranks beyond the largest power of two
// folded into their neighbours first and sent the result last. Every exchange
// reduces the same two operands on both sides, so all ranks end bit for bit equal.
func rdAllReduce(x *call, g group, buf []byte) error {
	n, me := g.n(), g.me
	if n == 1 {
		return nil
	}
	p := 1
	for p*2 <= n {
		p *= 2
	}
	rem := n - p
	nb := len(buf)
	newme := me - rem
	if me < 2*rem {
		newme = -1
		if me%2 == 0 {
			if err := x.send(g.at(me+1), 0, buf); err != nil {
				return err
			}
		} else {
			in, err := x.recv(g.at(me-1), 0, nb)
			if err != nil {
				return err
			}
			x.k(buf, buf, in)
			x.release(g.at(me - 1))
			newme = me / 2
		}
	}
	if newme >= 0 {
		step := uint32(1)
		for mask := 1; mask < p; mask <<= 1 {
			pn := newme ^ mask
			peer := pn + rem
			if pn < rem {
				peer = 2*pn + 1
			}
			pr := g.at(peer)
			if err := x.send(pr, step, buf); err != nil {
				return err
			}
			in, err := x.recv(pr, step, nb)
			if err != nil {
				return err
			}
			x.k(buf, buf, in)
			x.release(pr)
			step++
		}
	}
	if me < 2*rem {
		if me%2 == 1 {
			return x.send(g.at(me-1), 64, buf)
		}
		return x.recvCopy(g.at(me+1), 64, buf)
	}
	return nil
}

// treeBroadcast is the binomial tree from root (an index into g), for buffers of
// at most one chunk.
func treeBroadcast(x *call, g group, buf []byte, root int) error {
	n := g.n()
	vr := mod(g.me-root, n)
	mask := 1
	for mask < n {
		if vr&mask != 0 {
			if err := x.recvCopy(g.at(root+vr-mask), 0, buf); err != nil {
				return err
			}
			break
		}
		mask <<= 1
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		if vr+mask < n {
			if err := x.send(g.at(root+vr+mask), 0, buf); err != nil {
				return err
			}
		}
	}
	return nil
}

// chainBroadcast pipelines chunks from root along the ranks in order.
func chainBroadcast(x *call, g group, buf []byte, root int) error {
	n := g.n()
	vr := mod(g.me-root, n)
	prev, next := g.at(root+vr-1), g.at(root+vr+1)
	for k := range x.pieces(len(buf)) {
		p := x.piece(buf, k)
		var err error
		if vr == 0 {
			err = x.send(next, uint32(k), p)
		} else {
			err = x.relay(prev, uint32(k), p, next, uint32(k), vr < n-1)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// treeReduce reduces up a binomial tree to root, for buffers of at most one
// chunk. Unless clobber, buf is left alone on every rank but root, and ranks with
// children accumulate into scratch memory.
func treeReduce(x *call, g group, buf []byte, root int, clobber bool) error {
	n := g.n()
	vr := mod(g.me-root, n)
	acc := buf
	var scratch *[]byte
	defer func() {
		if scratch != nil {
			x.c.pool.put(scratch)
		}
	}()
	first := vr != 0 && !clobber
	for mask := 1; mask < n; mask <<= 1 {
		if vr&mask != 0 {
			return x.send(g.at(root+vr-mask), 0, acc)
		}
		if vr+mask >= n {
			continue
		}
		from := g.at(root + vr + mask)
		in, err := x.recv(from, 0, len(buf))
		if err != nil {
			return err
		}
		if first {
			scratch = x.c.pool.get(len(buf))
			acc = *scratch
			x.k(acc, buf, in)
			first = false
		} else {
			x.k(acc, acc, in)
		}
		x.release(from)
	}
	return nil
}

// chainReduce pipelines chunks along the ranks towards root: the rank farthest
// from root sends its data, every rank on the way reduces what it receives with
// its own straight into the frame it passes on, and root reduces into buf. Only
// root's buf changes.
func chainReduce(x *call, g group, buf []byte, root int) error {
	n := g.n()
	vr := mod(g.me-root, n)
	prev, next := g.at(root+vr+1), g.at(root+vr-1)
	for k := range x.pieces(len(buf)) {
		p := x.piece(buf, k)
		if vr == n-1 {
			if err := x.send(next, uint32(k), p); err != nil {
				return err
			}
			continue
		}
		in, err := x.recv(prev, uint32(k), len(p))
		if err != nil {
			return err
		}
		if vr == 0 {
			x.k(p, in, p)
			x.release(prev)
			continue
		}
		out, err := x.reserve(next, len(p))
		if err != nil {
			return err
		}
		x.redFrame(out, in, p)
		x.release(prev)
		if err := x.commit(next, uint32(k), len(p)); err != nil {
			return err
		}
	}
	return nil
}

// ringAllGather passes blocks of b bytes around the ring, one chunk of every block
// per round. recv holds the blocks in group order; this rank's is in place.
func ringAllGather(x *call, g group, recv []byte, b int) error {
	n := g.n()
	if n == 1 {
		return nil
	}
	left, right := g.at(g.me-1), g.at(g.me+1)
	block := func(j int) []byte {
		j = mod(j, n)
		return recv[j*b : (j+1)*b]
	}
	for k := range x.pieces(b) {
		if err := x.send(right, 0, x.piece(block(g.me), k)); err != nil {
			return err
		}
		for s := 0; s < n-1; s++ {
			if err := x.relay(left, uint32(s), x.piece(block(g.me-s-1), k), right, uint32(s+1), s < n-2); err != nil {
				return err
			}
		}
	}
	return nil
}

// linearGather: every rank sends its block to root, which takes them in order.
func linearGather(x *call, g group, send, recv []byte, root int) error {
	b := len(send)
	if g.me != root {
		return x.sendPieces(g.at(root), send)
	}
	copy(recv[root*b:(root+1)*b], send)
	for j := range g.n() {
		if j == root {
			continue
		}
		if err := x.recvPieces(g.at(j), recv[j*b:(j+1)*b]); err != nil {
			return err
		}
	}
	return nil
}

// linearScatter: root sends every rank its block.
func linearScatter(x *call, g group, send, recv []byte, root int) error {
	b := len(recv)
	if g.me != root {
		return x.recvPieces(g.at(root), recv)
	}
	for j := range g.n() {
		if j == root {
			continue
		}
		if err := x.sendPieces(g.at(j), send[j*b:(j+1)*b]); err != nil {
			return err
		}
	}
	copy(recv, send[root*b:(root+1)*b])
	return nil
}

// ringReduceScatter reduces blocks of len(recv) bytes around the ring: block j
// starts at rank j+1, every rank adds its own block j to the partial sum straight
// into the frame it passes on, and rank j ends with the total.
func ringReduceScatter(x *call, g group, send, recv []byte) error {
	n := g.n()
	b := len(recv)
	if n == 1 {
		copy(recv, send)
		return nil
	}
	left, right := g.at(g.me-1), g.at(g.me+1)
	block := func(j int) []byte {
		j = mod(j, n)
		return send[j*b : (j+1)*b]
	}
	for k := range x.pieces(b) {
		if err := x.send(right, 0, x.piece(block(g.me-1), k)); err != nil {
			return err
		}
		for s := 0; s < n-1; s++ {
			mine := x.piece(block(g.me-s-2), k)
			in, err := x.recv(left, uint32(s), len(mine))
			if err != nil {
				return err
			}
			if s == n-2 {
				x.k(x.piece(recv, k), in, mine)
				x.release(left)
				continue
			}
			out, err := x.reserve(right, len(mine))
			if err != nil {
				return err
			}
			x.redFrame(out, in, mine)
			x.release(left)
			if err := x.commit(right, uint32(s+1), len(mine)); err != nil {
				return err
			}
		}
	}
	return nil
}

// pairwiseAllToAll: in step s every rank sends to rank+s and receives from
// rank-s, chunk by chunk.
func pairwiseAllToAll(x *call, g group, send, recv []byte) error {
	n := g.n()
	b := len(send) / n
	copy(recv[g.me*b:(g.me+1)*b], send[g.me*b:(g.me+1)*b])
	for s := 1; s < n; s++ {
		to, from := mod(g.me+s, n), mod(g.me-s, n)
		src := send[to*b : (to+1)*b]
		dst := recv[from*b : (from+1)*b]
		for k := range x.pieces(b) {
			if err := x.send(g.at(to), uint32(s), x.piece(src, k)); err != nil {
				return err
			}
			if err := x.recvCopy(g.at(from), uint32(s), x.piece(dst, k)); err != nil {
				return err
			}
		}
	}
	return nil
}

// dissemination is the barrier: in round k every rank signals rank+2^k and
// waits for rank-2^k.
func dissemination(x *call, g group) error {
	n := g.n()
	for k, d := uint32(0), 1; d < n; k, d = k+1, d*2 {
		if err := x.send(g.at(g.me+d), k, nil); err != nil {
			return err
		}
		from := g.at(g.me - d)
		if _, err := x.recv(from, k, 0); err != nil {
			return err
		}
		x.release(from)
	}
	return nil
}

// halvingAllReduce is the AllReduce of Rabenseifner: a reduce-scatter by
// recursive halving (log2 p exchanges, each of half the data of the one
// before), then an allgather by recursive doubling, among the largest power of
// two p of ranks; the ranks beyond it are folded into their neighbours first
// and sent the result last, as in rdAllReduce. It moves as many bytes as the
// ring but in 2 log2(p) steps instead of 2(n-1), each between a pair of ranks
// rather than around the whole ring: over TCP, where every step costs a round
// of system calls and, on an oversubscribed host, of context switches, that
// pays from a few hundred KiB (docs/collectives.md). Every block is reduced
// on one rank and copied to the others, so all ranks end bit for bit equal.
//
// Like the ring, it works in rounds of a chunk per rank of the power of two,
// so that a round's blocks stay in cache from one step to the next.
func halvingAllReduce(x *call, g group, buf []byte) error {
	n := g.n()
	if n == 1 {
		return nil
	}
	p := 1
	for p*2 <= n {
		p *= 2
	}
	round := x.chunk / x.es * p * x.es
	for base := 0; base < len(buf); base += round {
		if err := halvingRound(x, g, p, buf[base:min(base+round, len(buf))]); err != nil {
			return err
		}
	}
	if len(buf) == 0 {
		return halvingRound(x, g, p, buf)
	}
	return nil
}

// halvingRound is one round of halvingAllReduce, among the power of two p of
// ranks.
func halvingRound(x *call, g group, p int, buf []byte) error {
	n, me := g.n(), g.me
	rem := n - p
	es := x.es
	count := len(buf) / es
	step := func(s, k int) uint32 { return uint32(s<<16 | k) }
	// The folding exchange is step 0; the halving and doubling steps follow;
	// the last is the unfolding.
	last := 1
	for m := 1; m < p; m <<= 1 {
		last += 2
	}
	newme := me - rem
	if me < 2*rem {
		newme = -1
		if me%2 == 0 {
			to := g.at(me + 1)
			for k := range x.pieces(len(buf)) {
				if err := x.send(to, step(0, k), x.piece(buf, k)); err != nil {
					return err
				}
			}
		} else {
			from := g.at(me - 1)
			for k := range x.pieces(len(buf)) {
				mine := x.piece(buf, k)
				in, err := x.recv(from, step(0, k), len(mine))
				if err != nil {
					return err
				}
				x.k(mine, mine, in)
				x.release(from)
			}
			newme = me / 2
		}
	}
	if newme >= 0 {
		// real is the group index of virtual rank v.
		real := func(v int) int {
			if v < rem {
				return 2*v + 1
			}
			return v + rem
		}
		// blocks returns the bytes of blocks [a, b) of p.
		blocks := func(a, b int) []byte {
			lo, _ := part(count, p, a)
			_, hi := part(count, p, b-1)
			return buf[lo*es : hi*es]
		}
		lo, hi := 0, p
		s := 1
		for mask := p / 2; mask >= 1; mask >>= 1 {
			peer := g.at(real(newme ^ mask))
			mid := (lo + hi) / 2
			keep, give := blocks(lo, mid), blocks(mid, hi)
			if newme&mask == 0 {
				hi = mid
			} else {
				keep, give = give, keep
				lo = mid
			}
			for k := range max(x.pieces(len(keep)), x.pieces(len(give))) {
				if k < x.pieces(len(give)) {
					if err := x.send(peer, step(s, k), x.piece(give, k)); err != nil {
						return err
					}
				}
				if k < x.pieces(len(keep)) {
					mine := x.piece(keep, k)
					in, err := x.recv(peer, step(s, k), len(mine))
					if err != nil {
						return err
					}
					x.k(mine, mine, in)
					x.release(peer)
				}
			}
			s++
		}
		for mask := 1; mask < p; mask <<= 1 {
			peer := g.at(real(newme ^ mask))
			mine := blocks(lo, hi)
			var theirs []byte
			if newme&mask == 0 {
				theirs = blocks(hi, hi+(hi-lo))
				hi += hi - lo
			} else {
				theirs = blocks(lo-(hi-lo), lo)
				lo -= hi - lo
			}
			for k := range max(x.pieces(len(mine)), x.pieces(len(theirs))) {
				if k < x.pieces(len(mine)) {
					if err := x.send(peer, step(s, k), x.piece(mine, k)); err != nil {
						return err
					}
				}
				if k < x.pieces(len(theirs)) {
					if err := x.recvCopy(peer, step(s, k), x.piece(theirs, k)); err != nil {
						return err
					}
				}
			}
			s++
		}
	}
	if me < 2*rem {
		if me%2 == 1 {
			return x.sendPieces2(g.at(me-1), step(last, 0), buf)
		}
		return x.recvPieces2(g.at(me+1), step(last, 0), buf)
	}
	return nil
}

// sendPieces2 and recvPieces2 are sendPieces and recvPieces with frames
// numbered from first.
func (x *call) sendPieces2(to int, first uint32, b []byte) error {
	for k := range x.pieces(len(b)) {
		if err := x.send(to, first+uint32(k), x.piece(b, k)); err != nil {
			return err
		}
	}
	return nil
}

func (x *call) recvPieces2(from int, first uint32, b []byte) error {
	for k := range x.pieces(len(b)) {
		if err := x.recvCopy(from, first+uint32(k), x.piece(b, k)); err != nil {
			return err
		}
	}
	return nil
}
