package roles

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// TCP common to the three streams. A client opens with a hello: a 4-byte stream
// magic, the server's 16-byte nonce (which it learned through the world's
// authenticated key-value exchange, so a stranger on the network cannot connect)
// and its world rank as a little-endian u32; the server answers one byte, 0 for
// accepted. What follows is the stream's own framing.
const (
	helloSize       = 4 + 16 + 4
	handshakeLimit  = 10 * time.Second
	goodbyeDeadline = time.Second
)

func newNonce() []byte {
	b := make([]byte, 16)
	rand.Read(b)
	return b
}

// tconn is an accepted connection: its peer's world rank, and a lock that every
// writer holds, so that the server's goodbye never lands inside another frame.
type tconn struct {
	net.Conn
	peer int
	wmu  sync.Mutex
}

// write writes b whole under the connection's write lock.
func (c *tconn) write(b ...[]byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for _, p := range b {
		if _, err := c.Write(p); err != nil {
			return err
		}
	}
	return nil
}

// listenTCP starts the TCP listener of a stream's server end, unless opt keeps
// the stream to shared memory (then it returns nil), and puts its address and a
// new nonce in ep.
func listenTCP(opt config, magic string, ep *endpoint, handle func(c *tconn)) (*tcpServer, error) {
	if opt.transport == TransportShm {
		return nil, nil
	}
	ep.Nonce = newNonce()
	t, err := startTCP(opt.listenHost, magic, ep.Nonce, handle)
	if err != nil {
		return nil, err
	}
	ep.TCP = t.addr
	return t, nil
}

// tcpServer accepts authenticated connections and runs handle on each, on a
// goroutine of its own; close stops accepting, says goodbye on every connection,
// closes them and waits for the handlers.
type tcpServer struct {
	ln     net.Listener
	addr   string
	magic  string
	nonce  []byte
	handle func(c *tconn)
	wg     sync.WaitGroup

	mu      sync.Mutex
	conns   map[*tconn]struct{}
	closing bool
}

func startTCP(host, magic string, nonce []byte, handle func(c *tconn)) (*tcpServer, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, fmt.Errorf("roles: listen on %s: %w", host, err)
	}
	s := &tcpServer{ln: ln, addr: ln.Addr().String(), magic: magic, nonce: nonce, handle: handle, conns: map[*tconn]struct{}{}}
	s.wg.Go(s.acceptLoop)
	return s, nil
}

func (s *tcpServer) acceptLoop() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return // closed
		}
		tc := &tconn{Conn: c}
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[tc] = struct{}{}
		s.mu.Unlock()
		s.wg.Go(func() {
			defer func() {
				s.mu.Lock()
				delete(s.conns, tc)
				s.mu.Unlock()
				c.Close()
			}()
			if s.accept(tc) {
				s.handle(tc)
			}
		})
	}
}

// accept reads and checks a hello.
func (s *tcpServer) accept(c *tconn) bool {
	c.SetDeadline(time.Now().Add(handshakeLimit))
	var h [helloSize]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return false
	}
	if string(h[:4]) != s.magic || subtle.ConstantTimeCompare(h[4:20], s.nonce) != 1 {
		c.Write([]byte{1})
		return false
	}
	if _, err := c.Write([]byte{0}); err != nil {
		return false
	}
	c.SetDeadline(time.Time{})
	c.peer = int(binary.LittleEndian.Uint32(h[20:]))
	return true
}

// goodbye stops accepting and writes goodbye (if set) to every open connection,
// under its write lock and a short deadline (which also frees a handler stuck in
// a write). The connections stay open until shutdown, so that the owner can
// signal its handlers in between.
func (s *tcpServer) goodbye(goodbye []byte) {
	s.mu.Lock()
	s.closing = true
	conns := make([]*tconn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	s.ln.Close()
	if goodbye == nil {
		return
	}
	for _, c := range conns {
		c.SetWriteDeadline(time.Now().Add(goodbyeDeadline))
		c.write(goodbye)
	}
}

// shutdown closes every connection and joins the handlers; goodbye must come
// first. With ack > 0 it first gives the handlers up to ack to end on their own,
// which they do when their peers acknowledge the goodbye by closing their side.
func (s *tcpServer) shutdown(ack time.Duration) {
	joined := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(joined)
	}()
	if ack > 0 {
		t := time.NewTimer(ack)
		select {
		case <-joined:
		case <-t.C:
		}
		t.Stop()
	}
	s.mu.Lock()
	conns := make([]*tconn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	<-joined
}

// dialTCP connects to a server and says hello as rank me.
func dialTCP(ctx context.Context, addr, magic string, nonce []byte, me int) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	c.SetDeadline(time.Now().Add(handshakeLimit))
	var h [helloSize]byte
	copy(h[:4], magic)
	copy(h[4:20], nonce)
	binary.LittleEndian.PutUint32(h[20:], uint32(me))
	var st [1]byte
	if _, err = c.Write(h[:]); err == nil {
		_, err = io.ReadFull(c, st[:])
	}
	if err == nil && st[0] != 0 {
		err = errors.New("the server refused the hello")
	}
	if err == nil && !stop() {
		err = ctx.Err()
	}
	if err != nil {
		c.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// readCtx reads into buf[*got:] until it is full, keeping *got across calls: a
// read cut short by ctx leaves the bytes read so far in place, and the next call
// goes on from there, so a cancelled read never desynchronises the stream.
func readCtx(ctx context.Context, c net.Conn, buf []byte, got *int) error {
	if *got >= len(buf) {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { c.SetReadDeadline(time.Now()) })
	defer func() {
		if !stop() {
			c.SetReadDeadline(time.Time{})
		}
	}()
	for *got < len(buf) {
		n, err := c.Read(buf[*got:])
		*got += n
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				// The deadline of an earlier, finished call fired late.
				c.SetReadDeadline(time.Time{})
				continue
			}
			return err
		}
	}
	return nil
}
