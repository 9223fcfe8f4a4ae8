package collective

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A TCP link reads its socket in one of two ways. A call waiting for a frame
// reads the socket itself, non-blocking, polling until a frame is complete or
// Tuning.Spin has passed: no goroutine, wake-up or channel lies between the
// kernel and the call, so a small frame costs one writev and a read or two.
// Past the spin, or while no call is waiting, the link's reader goroutine
// reads: it waits in poll(2) until the socket is readable and moves whole
// frames into the link's queue, so that a peer's sends never wait long for
// this rank to call a receive, and a broken connection is noticed at once.
// Both read through one frame parser under rmu.
//
// The socket is kept out of Go's netpoller (the link owns a duplicate of the
// connection's descriptor and closes the net.Conn): there, every frame that
// arrives would wake a thread of this process blocked in epoll_wait, and that
// thread shares the core with the call polling for the frame. While a call
// has read the socket within the last readerPause (or spin period, if
// longer), the reader goroutine is not in poll(2) either: it sleeps until the
// call parks or the pause passes.
//
// A frame is written with one writev (header and payload from the caller's
// memory) on the non-blocking socket; when the socket is full, the call hands
// reading to the reader goroutine and polls for room in slices, watching its
// context and the communicator.

type tcpLink struct {
	t    *tcpTransport
	peer int
	addr string // the peer's address, for errors
	fd   int    // the socket, non-blocking, owned by the link; closed by close
	q    *frameQueue

	rmu sync.Mutex // held while reading the socket
	rd  frameReader
	// A posted receive (under rmu): the payload of the next frame that match
	// accepts is read straight into post.
	post      []byte
	postMatch func(h *header) bool
	lastRead  atomic.Int64  // when a call last read the socket itself (ns since t.epoch); 0: none is
	wake      chan struct{} // wakes the paused reader goroutine

	wmu  sync.Mutex
	wbuf *[]byte
	hdr  [headerSize]byte
	cur  qframe
}

// frameReader is the parser of the byte stream from a peer: bytes read ahead
// into stage, and the frame whose payload is being read.
type frameReader struct {
	stage  []byte
	lo, hi int // stage[lo:hi] is read but not parsed
	h      header
	body   *[]byte // the payload of h, got bytes of it read
	direct bool    // body is a posted receive, not a pool buffer
	big    bool    // the last frame's payload was at least bigFrame
	got    int
	err    error // the stream's end, once reached
}

// stageBytes is how much a read into the stage takes at most; payloads larger
// than what the stage holds of them are read straight into their buffer.
const stageBytes = 64 << 10

// bigFrame: after a frame at least this large the next header is read on its
// own, as the next payload is likely large too: read through the stage, it
// would cost a copy more.
const bigFrame = 16 << 10

// newTCPLink makes a link of connection c, which it takes over: it keeps a
// duplicate of c's descriptor and closes c (and with it c's registration in the
// netpoller).
func newTCPLink(t *tcpTransport, peer int, c *net.TCPConn) (*tcpLink, error) {
	defer c.Close()
	c.SetNoDelay(true)
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("collective: connection to rank %d: %w", peer, err)
	}
	l := &tcpLink{t: t, peer: peer, addr: c.RemoteAddr().String(), fd: -1, q: newFrameQueue(), wake: make(chan struct{}, 1)}
	var derr error
	if err := rc.Control(func(fd uintptr) {
		l.fd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		derr = err
	}
	if derr != nil {
		return nil, fmt.Errorf("collective: connection to rank %d at %s: %w", peer, l.addr, derr)
	}
	if err := unix.SetNonblock(l.fd, true); err != nil {
		unix.Close(l.fd)
		return nil, fmt.Errorf("collective: connection to rank %d at %s: %w", peer, l.addr, err)
	}
	l.rd.stage = make([]byte, stageBytes)
	return l, nil
}

func (l *tcpLink) maxPayload() int { return l.t.maxP }

func (l *tcpLink) streams() bool { return false }

func (l *tcpLink) now() int64 { return int64(time.Since(l.t.epoch)) | 1 }

// errAgain: the socket has no more bytes now.
var errAgain = errors.New("collective: would block")

// read reads what the socket holds into p: a non-blocking read, made as a raw
// system call (it never blocks, so the scheduler need not know).
func (l *tcpLink) read(p []byte) (int, error) {
	for {
		n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(l.fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
		switch {
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN:
			return 0, errAgain
		case e != 0:
			return 0, e
		case n == 0:
			return 0, io.EOF
		}
		return int(n), nil
	}
}

// pump parses what the socket holds into frames in the queue. With all it reads
// until the socket has nothing more (the reader goroutine, which then waits
// for the socket to become readable); without, it returns once a frame is
// complete and no bytes are left over. It returns how many frames it queued,
// and the end of the stream once reached (the queue then ends with it). The
// caller holds rmu.
func (l *tcpLink) pump(all bool) (int, error) {
	r := &l.rd
	if r.err != nil {
		return 0, r.err
	}
	frames := 0
	for {
		if r.body != nil {
			b := *r.body
			if r.lo < r.hi {
				n := copy(b[r.got:], r.stage[r.lo:r.hi])
				r.lo += n
				r.got += n
			}
			if r.got < len(b) {
				n, err := l.read(b[r.got:])
				if err == errAgain {
					return frames, nil
				}
				if err != nil {
					return frames, l.end(err)
				}
				r.got += n
				continue
			}
			own := r.body
			r.body = nil
			if r.direct {
				own, r.direct = nil, false
			}
			if r.h.kind == kindBye {
				// The peer closed; its note says why, if it failed.
				err := l.t.lostErr(l.peer, "it closed the communicator")
				if len(b) > 0 {
					err = decodeAbort(b)
				}
				l.t.pool.put(own)
				r.err = err
				l.q.finish(err)
				return frames, err
			}
			r.big = len(b) >= bigFrame
			l.q.push(qframe{h: r.h, buf: b, own: own})
			frames++
			if !all && r.lo == r.hi {
				return frames, nil
			}
			continue
		}
		if r.hi-r.lo >= headerSize {
			r.h.decode(r.stage[r.lo:r.hi])
			r.lo += headerSize
			if int(r.h.n) > l.t.maxP {
				return frames, l.end(fmt.Errorf("frame of %d bytes over the limit of %d", r.h.n, l.t.maxP))
			}
			r.got = 0
			if l.postMatch != nil && int(r.h.n) == len(l.post) && l.postMatch(&r.h) {
				dst := l.post
				r.body, r.direct = &dst, true
				l.post, l.postMatch = nil, nil
				continue
			}
			r.body = l.t.pool.get(int(r.h.n))
			continue
		}
		if r.lo > 0 {
			r.hi = copy(r.stage, r.stage[r.lo:r.hi])
			r.lo = 0
		}
		// After a large frame, or with a receive posted, read just the
		// header: the payload then goes straight to its buffer, not through
		// the stage.
		room := len(r.stage)
		if r.big || l.postMatch != nil {
			room = headerSize
		}
		n, err := l.read(r.stage[r.hi:room])
		if err == errAgain {
			return frames, nil
		}
		if err != nil {
			return frames, l.end(err)
		}
		r.hi += n
	}
}

// end records that the stream from the peer ended with err, ends the queue,
// and fails the communicator unless it is closing. The caller holds rmu.
func (l *tcpLink) end(err error) error {
	if l.rd.err != nil {
		return l.rd.err
	}
	if l.t.closing.Load() {
		l.rd.err = ErrClosed
		l.q.finish(ErrClosed)
		return ErrClosed
	}
	why := "connection lost"
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		why = "connection closed without a goodbye"
	} else if err != nil {
		why = "connection lost: " + err.Error()
	}
	lost := l.t.lostErr(l.peer, why)
	l.rd.err = lost
	l.q.finish(lost)
	l.t.fail(lost)
	return lost
}

// callReading reports whether a call read the socket within the reader's
// pause.
func (l *tcpLink) callReading() bool {
	t := l.lastRead.Load()
	return t != 0 && l.now()-t < int64(l.t.quiet())
}

// quiet is how long the reader goroutine stays away after a call read.
func (t *tcpTransport) quiet() time.Duration { return max(t.spin, readerPause) }

// readerPause is the least time the reader goroutine sleeps while calls read
// the socket. Each time it ends, the goroutine wakes to look again, and that
// wake-up takes a thread, and a core, from the ranks: at 2 ms (the spin of an
// oversubscribed host) it made the hierarchical 8-byte AllReduce across two
// network namespaces 20-27 µs instead of 16-18. Calls that keep reading keep it
// asleep; a call that stops reading without parking (it returned, and the rank
// computes) leaves the socket unread for at most this long: the kernel's
// buffers hold what arrives meanwhile, a write that finds them full hands
// reading to every reader at once (handOff), and the next call notices a
// broken connection when it reads.
const readerPause = 250 * time.Millisecond

// readLoop is the link's reader goroutine.
func (l *tcpLink) readLoop() {
	defer l.t.wg.Done()
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	fds := []unix.PollFd{{Fd: int32(l.fd), Events: unix.POLLIN}}
	for {
		// A call reads the socket: stay out of its way until it parks, or
		// stops reading for the pause.
		for l.callReading() && !l.t.closing.Load() {
			if timer == nil {
				timer = time.NewTimer(l.t.quiet())
			} else {
				timer.Reset(l.t.quiet())
			}
			select {
			case <-l.wake:
			case <-timer.C:
			case <-l.t.stopc:
			}
		}
		l.rmu.Lock()
		_, end := l.pump(true)
		l.rmu.Unlock()
		if end != nil {
			return
		}
		// Wait for bytes. The wait is a blocking system call on this
		// goroutine's thread; it ends when bytes or the end of the stream
		// arrive (close shuts the socket down), or after readerSlice, to look
		// at the state again.
		fds[0].Revents = 0
		if _, err := unix.Poll(fds, int(readerSlice/time.Millisecond)); err != nil && err != unix.EINTR {
			l.rmu.Lock()
			l.end(err)
			l.rmu.Unlock()
			return
		}
	}
}

// readerSlice bounds one poll(2) of a reader goroutine.
const readerSlice = time.Second

// handOff gives the reading of the socket back to the reader goroutine.
func (l *tcpLink) handOff() {
	if l.lastRead.Load() == 0 {
		return
	}
	l.lastRead.Store(0)
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// tcpPureSpin is how long a wait polls its socket before it yields the CPU
// between polls (unless the machine is oversubscribed: then it yields from the
// start).
const tcpPureSpin = 50 * time.Microsecond

// wait returns the next frame from the peer: it reads the socket itself for a
// spin period, then parks on the queue that the reader goroutine fills.
func (l *tcpLink) wait(ctx context.Context) (qframe, error) {
	if f, ok := l.q.tryPop(); ok {
		return f, nil
	}
	t := l.t
	sig := t.sig
	done := ctx.Done()
	var start time.Time
	pure := !t.yield
	for i := 1; t.spin > 0; i++ {
		if l.rmu.TryLock() {
			l.lastRead.Store(l.now())
			_, err := l.pump(false)
			l.rmu.Unlock()
			if f, ok := l.q.tryPop(); ok {
				return f, nil
			}
			if err != nil {
				return qframe{}, err
			}
		} else if f, ok := l.q.tryPop(); ok {
			return f, nil
		}
		if !pure {
			if t.gosched {
				runtime.Gosched()
			} else {
				unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			}
		} else if i&63 == 0 {
			runtime.Gosched() // the other goroutines of this process
		}
		if i&15 == 0 {
			if sig.failed.Load() {
				l.handOff()
				return qframe{}, errStopped
			}
			select {
			case <-done:
				l.handOff()
				return qframe{}, ctx.Err()
			default:
			}
			if start.IsZero() {
				start = time.Now()
				continue
			}
			waited := time.Since(start)
			if waited > t.spin {
				break
			}
			if pure && waited > tcpPureSpin && !boundAlone() {
				pure = false
			}
		}
	}
	l.handOff()
	return l.q.pop(ctx, sig)
}

func (l *tcpLink) next(ctx context.Context) (header, []byte, error) {
	f, err := l.wait(ctx)
	if err != nil {
		return header{}, nil, err
	}
	l.cur = f
	return f.h, f.buf, nil
}

func (l *tcpLink) release() {
	l.t.pool.put(l.cur.own)
	l.cur = qframe{}
}

func (l *tcpLink) peek() (header, bool) { return l.q.peek() }

// postRecv posts dst for the payload of the next frame that match accepts, if
// that frame is still unread: nothing is queued and no payload is half read, so
// that the next frame read is the next the peer sent. The caller has no frame
// from this peer waiting elsewhere that match would accept, and calls unpostRecv
// once it has its frame (which, if the post took it, is dst itself).
func (l *tcpLink) postRecv(dst []byte, match func(h *header) bool) {
	l.rmu.Lock()
	if _, queued := l.q.peek(); !queued && l.rd.body == nil && l.rd.err == nil {
		l.post, l.postMatch = dst, match
	}
	l.rmu.Unlock()
}

func (l *tcpLink) unpostRecv() {
	l.rmu.Lock()
	l.post, l.postMatch = nil, nil
	l.rmu.Unlock()
}

func (l *tcpLink) reserve(ctx context.Context, n int) ([]byte, error) {
	if n > l.t.maxP {
		return nil, fmt.Errorf("collective: frame of %d bytes over the limit of %d", n, l.t.maxP)
	}
	if l.t.sig.failed.Load() {
		return nil, errStopped
	}
	l.wbuf = l.t.pool.get(headerSize + n)
	return (*l.wbuf)[headerSize:], nil
}

func (l *tcpLink) commit(ctx context.Context, h header) error {
	b := l.wbuf
	l.wbuf = nil
	defer l.t.pool.put(b)
	h.encode(*b)
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return l.write(ctx, (*b)[:headerSize+int(h.n)], nil)
}

// sendFrom sends a frame whose payload is p, straight from p.
func (l *tcpLink) sendFrom(ctx context.Context, h header, p []byte) error {
	if len(p) > l.t.maxP {
		return fmt.Errorf("collective: frame of %d bytes over the limit of %d", len(p), l.t.maxP)
	}
	if l.t.sig.failed.Load() {
		return errStopped
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	h.encode(l.hdr[:])
	return l.write(ctx, l.hdr[:], p)
}

// write writes a and then b: at once if the socket takes them, else by
// polling for room, in slices of writeSlice, until the peer has taken them, ctx
// ends or the communicator fails. The caller holds wmu.
func (l *tcpLink) write(ctx context.Context, a, b []byte) error {
	return l.writeUntil(a, b, func() error {
		if l.t.sig.failed.Load() {
			return errStopped
		}
		return ctx.Err()
	})
}

// writeUntil writes a and b unless stop, asked between polls, says otherwise.
func (l *tcpLink) writeUntil(a, b []byte, stop func() error) error {
	var iov [2]unix.Iovec
	handed := false
	for len(a)+len(b) > 0 {
		n, e := l.writev(&iov, a, b)
		if e == 0 {
			if n >= len(a) {
				a, b = b[n-len(a):], nil
			} else {
				a = a[n:]
			}
			continue
		}
		if e == unix.EINTR {
			continue
		}
		if e != unix.EAGAIN {
			return l.writeFailed(e)
		}
		// The socket is full: while this call waits for the peer to read,
		// the reader goroutines keep this rank reading, on every link (a
		// peer blocked writing to this rank, on this connection or another,
		// must not wait for a paused reader to wake by itself).
		if !handed {
			for _, o := range l.t.links {
				o.handOff()
			}
			handed = true
		}
		if err := stop(); err != nil {
			return err
		}
		fds := []unix.PollFd{{Fd: int32(l.fd), Events: unix.POLLOUT}}
		if _, err := unix.Poll(fds, int(writeSlice/time.Millisecond)); err != nil && err != unix.EINTR {
			return l.writeFailed(err)
		}
	}
	return nil
}

// writeSlice bounds one poll(2) for room in the socket: how late a blocked
// write notices that its context ended or the communicator failed.
const writeSlice = 5 * time.Millisecond

// writev writes a and b (b may be empty) with one non-blocking system call.
func (l *tcpLink) writev(iov *[2]unix.Iovec, a, b []byte) (int, unix.Errno) {
	n := 0
	if len(a) > 0 {
		iov[n].Base = unsafe.SliceData(a)
		iov[n].SetLen(len(a))
		n++
	}
	if len(b) > 0 {
		iov[n].Base = unsafe.SliceData(b)
		iov[n].SetLen(len(b))
		n++
	}
	r, _, e := unix.RawSyscall(unix.SYS_WRITEV, uintptr(l.fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(n))
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	return int(r), e
}

func (l *tcpLink) writeFailed(err error) error {
	if l.t.sig.failed.Load() {
		return errStopped
	}
	lost := l.t.lostErr(l.peer, "connection lost: "+err.Error())
	l.t.fail(lost)
	return lost
}

// tryNext takes the next frame from the peer if one is queued or the socket
// holds one whole, without waiting.
func (l *tcpLink) tryNext() (header, []byte, bool, error) {
	f, ok := l.q.tryPop()
	if !ok && l.rmu.TryLock() {
		l.lastRead.Store(l.now())
		_, err := l.pump(false)
		l.rmu.Unlock()
		if f, ok = l.q.tryPop(); !ok && err != nil {
			return header{}, nil, false, err
		}
	}
	if !ok {
		return header{}, nil, false, nil
	}
	l.cur = f
	return f.h, f.buf, true, nil
}

// outFrame is a frame to write: its encoded header and its payload.
type outFrame struct {
	h [headerSize]byte
	p []byte
}

// maxWriteFrames bounds the frames one writev takes.
const maxWriteFrames = 32

// writeFrames writes as much of fs as the socket takes now, from byte off of
// fs[0] on, in one writev; it returns how many bytes it wrote.
func (l *tcpLink) writeFrames(fs []outFrame, off int) (int, error) {
	var iov [2 * maxWriteFrames]unix.Iovec
	n := 0
	for i := range min(len(fs), maxWriteFrames) {
		h, p := fs[i].h[:], fs[i].p
		if i == 0 {
			if off < headerSize {
				h = h[off:]
			} else {
				h, p = nil, p[off-headerSize:]
			}
		}
		if len(h) > 0 {
			iov[n].Base = unsafe.SliceData(h)
			iov[n].SetLen(len(h))
			n++
		}
		if len(p) > 0 {
			iov[n].Base = unsafe.SliceData(p)
			iov[n].SetLen(len(p))
			n++
		}
	}
	for {
		r, _, e := unix.RawSyscall(unix.SYS_WRITEV, uintptr(l.fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(n))
		runtime.KeepAlive(fs)
		switch e {
		case 0:
			return int(r), nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, nil
		}
		return 0, l.writeFailed(e)
	}
}

// waitIO waits, for at most writeSlice, until the socket is readable, or
// writable with out.
func (l *tcpLink) waitIO(out bool) error {
	ev := int16(unix.POLLIN)
	if out {
		ev |= unix.POLLOUT
	}
	l.lastRead.Store(l.now())
	fds := []unix.PollFd{{Fd: int32(l.fd), Events: ev}}
	if _, err := unix.Poll(fds, int(writeSlice/time.Millisecond)); err != nil && err != unix.EINTR {
		return l.writeFailed(err)
	}
	return nil
}
