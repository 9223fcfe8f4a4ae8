package collective

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// The TCP transport: one connection per pair of ranks, the higher rank dialing the
// lower. A call waiting for a frame reads the socket itself (tcp_link.go); while
// no call does, each connection's reader goroutine moves frames into a queue as
// they arrive, so that a sender never waits for long for its peer to call a
// receive (two ranks may send each other any amount at once), and so that a
// broken connection is noticed at once even when no call is waiting on it.

const tcpMagic = "gearcol1"

type tcpPeer struct {
	rank  int // communicator rank
	addr  string
	nonce []byte
}

type tcpTransport struct {
	id      string
	me      int
	ln      *net.TCPListener
	nonce   [16]byte
	links   map[int]*tcpLink
	sig     *signals
	pool    *bufPool
	maxP    int
	closing atomic.Bool
	wg      sync.WaitGroup
	lostErr func(rank int, reason string) error
	fail    func(error)
	tuning  Tuning

	// How a call waits for a frame (tcp_link.go): it reads the socket itself
	// for spin (polling with sched_yield, or runtime.Gosched when gosched, if
	// yield), then parks while the link's reader goroutine reads.
	spin    time.Duration
	yield   bool
	gosched bool
	epoch   time.Time     // lastRead times count from here
	stopc   chan struct{} // closed by close: paused readers read on
}

var _ transport = (*tcpTransport)(nil)
var _ link = (*tcpLink)(nil)

// listenTCP opens the listener the peers will dial; host is the address by which
// the other ranks reach this one.
func listenTCP(id string, me int, host string) (*tcpTransport, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, fmt.Errorf("collective: listen for peers on %s: %w", host, err)
	}
	t := &tcpTransport{id: id, me: me, ln: ln.(*net.TCPListener), links: map[int]*tcpLink{}, stopc: make(chan struct{}), epoch: time.Now()}
	if _, err := rand.Read(t.nonce[:]); err != nil {
		ln.Close()
		return nil, fmt.Errorf("collective: nonce: %w", err)
	}
	return t, nil
}

func (t *tcpTransport) addr() string { return t.ln.Addr().String() }

// connect dials the lower-ranked peers and accepts the higher-ranked ones, then
// starts the readers. The listener is closed when it returns.
func (t *tcpTransport) connect(ctx context.Context, peers []tcpPeer, tuning Tuning, sig *signals, pool *bufPool, lostErr func(int, string) error, fail func(error)) error {
	t.sig, t.pool, t.maxP, t.lostErr, t.fail, t.tuning = sig, pool, tuning.ChunkBytes, lostErr, fail, tuning
	defer t.ln.Close()
	want := map[int]bool{}
	var dial []tcpPeer
	for _, p := range peers {
		if p.rank > t.me {
			want[p.rank] = true
		} else {
			dial = append(dial, p)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type accepted struct {
		rank int
		conn *net.TCPConn
	}
	acc := make(chan accepted, len(want))
	// The first failure, dialing or accepting, is the one reported; it ends
	// the other side's work.
	var firstMu sync.Mutex
	var first error
	failed := func(err error) {
		firstMu.Lock()
		if first == nil {
			first = err
		}
		firstMu.Unlock()
		cancel()
	}
	var awg sync.WaitGroup
	awg.Add(1)
	go func() {
		defer awg.Done()
		if err := t.acceptAll(ctx, want, func(r int, c *net.TCPConn) { acc <- accepted{r, c} }); err != nil {
			failed(err)
		}
	}()
	stop := context.AfterFunc(ctx, func() { t.ln.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	conns := map[int]*net.TCPConn{}
	for _, p := range dial {
		c, err := t.dial(ctx, p)
		if err != nil {
			failed(err)
			break
		}
		conns[p.rank] = c
	}
	awg.Wait()
	close(acc)
	for a := range acc {
		conns[a.rank] = a.conn
	}
	if err := first; err != nil {
		for _, c := range conns {
			c.Close()
		}
		return err
	}
	for r, c := range conns {
		l, err := newTCPLink(t, r, c)
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			for r, l := range t.links {
				unix.Close(l.fd)
				delete(t.links, r)
			}
			return err
		}
		t.links[r] = l
	}
	for _, l := range t.links {
		t.wg.Add(1)
		go l.readLoop()
	}
	return nil
}

// The handshake: the dialing rank greets with the magic, the nonce the
// accepting rank published, its own rank and the communicator's name; the
// accepting rank answers with a status byte and, when it refuses, why. A
// greeting that does not match fails the communicator on both ranks, with the
// peer's address and what did not match: a misconfigured peer (another job,
// another communicator, a stale address) must not look like a hang.

// greetStatus is the first byte of the answer to a greeting.
const (
	greetOK      = 0
	greetRefused = 1
)

// maxGreetNote bounds the reason of a refusal.
const maxGreetNote = 1024

func (t *tcpTransport) dial(ctx context.Context, p tcpPeer) (*net.TCPConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, fmt.Errorf("collective: rank %d: connect to rank %d at %s: %w", t.me, p.rank, p.addr, err)
	}
	c := nc.(*net.TCPConn)
	hello := make([]byte, 0, 64)
	hello = append(hello, tcpMagic...)
	hello = append(hello, p.nonce...)
	hello = binary.LittleEndian.AppendUint32(hello, uint32(t.me))
	hello = binary.LittleEndian.AppendUint16(hello, uint16(len(t.id)))
	hello = append(hello, t.id...)
	wait := t.tuning.greetTimeout()
	c.SetDeadline(time.Now().Add(wait))
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	fail := func(what string, err error) (*net.TCPConn, error) {
		c.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			err = fmt.Errorf("no answer within %v (Tuning.GreetTimeout): %w", wait, err)
		}
		return nil, fmt.Errorf("collective: rank %d: %s rank %d at %s: %w", t.me, what, p.rank, p.addr, err)
	}
	if _, err := c.Write(hello); err != nil {
		return fail("greet", err)
	}
	var ans [3]byte
	if _, err := io.ReadFull(c, ans[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			err = errors.New("it closed the connection without answering (not a gear collective listener, or an older gear)")
		}
		return fail("wait for the answer of", err)
	}
	if ans[0] != greetOK {
		note := make([]byte, min(int(binary.LittleEndian.Uint16(ans[1:])), maxGreetNote))
		io.ReadFull(c, note)
		c.Close()
		return nil, fmt.Errorf("collective: rank %d: rank %d at %s refused this rank's greeting: %s", t.me, p.rank, p.addr, note)
	}
	if !stop() && ctx.Err() != nil {
		c.Close()
		return nil, fmt.Errorf("collective: rank %d: greet rank %d at %s: %w", t.me, p.rank, p.addr, ctx.Err())
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// acceptAll accepts one connection from every rank in want. A greeting that
// does not match ends it with an error that names the peer; the peer hears why.
func (t *tcpTransport) acceptAll(ctx context.Context, want map[int]bool, got func(int, *net.TCPConn)) error {
	for len(want) > 0 {
		nc, err := t.ln.AcceptTCP()
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("collective: rank %d: waiting for ranks %v to connect: %w", t.me, waitingFor(want), ctx.Err())
			}
			return fmt.Errorf("collective: rank %d: accept peers: %w", t.me, err)
		}
		r, err := t.readHello(nc, want)
		if err != nil {
			t.refuse(nc, err)
			nc.Close()
			return err
		}
		nc.SetWriteDeadline(time.Now().Add(t.tuning.greetTimeout()))
		_, err = nc.Write([]byte{greetOK, 0, 0})
		nc.SetWriteDeadline(time.Time{})
		if err != nil {
			nc.Close()
			return fmt.Errorf("collective: rank %d: answer the greeting of rank %d at %s: %w", t.me, r, nc.RemoteAddr(), err)
		}
		delete(want, r)
		got(r, nc)
	}
	return nil
}

// waitingFor lists the ranks of want in order.
func waitingFor(want map[int]bool) []int {
	var rs []int
	for r := range want {
		rs = append(rs, r)
	}
	slices.Sort(rs)
	return rs
}

// refuse tells the peer of c why its greeting was refused, if it still listens.
func (t *tcpTransport) refuse(c *net.TCPConn, why error) {
	note := []byte(why.Error())
	if len(note) > maxGreetNote {
		note = note[:maxGreetNote]
	}
	msg := []byte{greetRefused, 0, 0}
	binary.LittleEndian.PutUint16(msg[1:], uint16(len(note)))
	c.SetWriteDeadline(time.Now().Add(t.tuning.byeTimeout()))
	c.Write(append(msg, note...))
}

// readHello reads a greeting and checks it against this rank's communicator
// and the ranks it still waits for.
func (t *tcpTransport) readHello(c *net.TCPConn, want map[int]bool) (int, error) {
	from := c.RemoteAddr().String()
	wait := t.tuning.greetTimeout()
	c.SetReadDeadline(time.Now().Add(wait))
	defer c.SetReadDeadline(time.Time{})
	bad := func(format string, args ...any) error {
		return fmt.Errorf("collective: rank %d of communicator %q: greeting from %s: "+format, append([]any{t.me, t.id, from}, args...)...)
	}
	b := make([]byte, len(tcpMagic)+16+4+2)
	read := func(p []byte, at int) error {
		n, err := io.ReadFull(c, p)
		if err == nil {
			return nil
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return bad("%d of %d bytes within %v (Tuning.GreetTimeout): %w", at+n, len(b), wait, err)
		}
		return bad("%d of %d bytes, then %w", at+n, len(b), err)
	}
	// The magic first: a stranger is named as one even if it sends less than
	// a greeting.
	if err := read(b[:len(tcpMagic)], 0); err != nil {
		return 0, err
	}
	if string(b[:len(tcpMagic)]) != tcpMagic {
		return 0, bad("starts with %q, want %q: not a gear collective peer", b[:len(tcpMagic)], tcpMagic)
	}
	if err := read(b[len(tcpMagic):], len(tcpMagic)); err != nil {
		return 0, err
	}
	r := int(binary.LittleEndian.Uint32(b[24:]))
	if !bytes.Equal(b[8:24], t.nonce[:]) {
		return 0, bad("rank %d brings the nonce of another listener (a rank of another job, or of an earlier communicator at a reused address)", r)
	}
	id := make([]byte, binary.LittleEndian.Uint16(b[28:]))
	if n, err := io.ReadFull(c, id); err != nil {
		return 0, bad("rank %d: communicator name: %d of %d bytes, then %w", r, n, len(id), err)
	}
	if string(id) != t.id {
		return 0, bad("rank %d is building communicator %q, this rank %q", r, id, t.id)
	}
	if !want[r] {
		return 0, bad("it says it is rank %d, but this rank waits for ranks %v", r, waitingFor(want))
	}
	return r, nil
}

func (t *tcpTransport) link(rank int) link { return t.links[rank] }

func (t *tcpTransport) close(note []byte) {
	if t.closing.Swap(true) {
		return
	}
	if t.ln != nil {
		t.ln.Close()
	}
	close(t.stopc) // paused readers read on, to the goodbyes
	for _, l := range t.links {
		l.wmu.Lock()
		if len(note) > t.maxP {
			note = note[:t.maxP]
		}
		bye := make([]byte, headerSize+len(note))
		h := header{kind: kindBye, n: uint32(len(note))}
		h.encode(bye)
		copy(bye[headerSize:], note)
		deadline := time.Now().Add(t.tuning.byeTimeout())
		l.writeUntil(bye, nil, func() error {
			if time.Now().After(deadline) {
				return os.ErrDeadlineExceeded
			}
			return nil
		})
		unix.Shutdown(l.fd, unix.SHUT_WR)
		l.wmu.Unlock()
	}
	// Let the readers see the peers' goodbyes (or EOF) so that nothing unread is
	// left in the socket when it closes; then shut the sockets down, which ends
	// the readers that still wait, and close them.
	done := make(chan struct{})
	go func() { t.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(200 * time.Millisecond):
	}
	for _, l := range t.links {
		unix.Shutdown(l.fd, unix.SHUT_RDWR)
	}
	<-done
	for _, l := range t.links {
		unix.Close(l.fd)
	}
	for _, l := range t.links {
		for {
			f, ok := l.q.tryPop()
			if !ok {
				break
			}
			t.pool.put(f.own)
		}
		if l.cur.own != nil {
			t.pool.put(l.cur.own)
			l.cur = qframe{}
		}
		if l.rd.body != nil && !l.rd.direct {
			t.pool.put(l.rd.body)
		}
		l.rd.body = nil
	}
}
