package roles

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/internal/errmark"
)

// Layout of a parameter segment: the common header, then
//
//	24   float count u64
//	192  latest u64: version<<1 | buffer index of the newest complete version; 0: none yet
//	256  notify u32: the futex word readers sleep on; bumped by every publish
//	320  sleeping u32: readers asleep on notify
//	512  buffer 0, buffer 1
//
// and in each buffer: a seqlock word u64 (odd while the publisher writes), the
// version u64 at +8, and the floats at +64. The publisher writes the buffer that
// latest does not point to, then points latest at it, so a reader copying the
// newest version is disturbed only by the publish after next; a reader validates
// its copy with the seqlock word and tries again if it changed.
const (
	paramMagic    = 0x316d7270_72616567 // "gearprm1"
	paramOffN     = 24
	paramLatest   = 192
	paramNotify   = 256
	paramSleeping = 320
	paramHeader   = 512
	bufSeq        = 0
	bufVersion    = 8
	bufData       = 64
	maxVersion    = math.MaxUint64 >> 1
)

func paramBufSize(n int) int    { return bufData + align64(4*n) }
func paramSegSize(n int) int    { return paramHeader + 2*paramBufSize(n) }
func paramBuf(n int, i int) int { return paramHeader + i*paramBufSize(n) }

const paramGoodbye = uint64(math.MaxUint64)

func floatsAt(seg *segment, off, n int) []float32 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&seg.mem[off])), n)
}

// TCP framing of the parameter service: a fetch is have u64 (the version the
// reader holds), wait u8 (block until a newer version exists) and 7 bytes of
// padding; the answer is version u64 and count u64, then count float32s in
// little-endian order (count is 0 when nothing newer than have exists, and
// version is then the newest). Version paramGoodbye says the publisher closed.
const (
	paramMagicTCP = "GRP1"
	fetchSize     = 16
	answerHeader  = 16
)

// Publisher is the parameter service's write end, on the trainer that owns the
// parameters: Publish makes a version visible to every Reader of the name.
type Publisher struct {
	name   string
	n      int
	seg    *segment
	tcp    *tcpServer
	closed chan struct{}
	once   sync.Once
	mark   closeMark

	mu     sync.Mutex // serialises Publish and Close
	last   uint64
	shut   bool
	change chan struct{} // closed and replaced by every Publish, for TCP fetches that wait

	// The checkpoint (CheckpointTo): its path, period, last write and the
	// highest version it reserves.
	ckPath   string
	ckEvery  time.Duration
	ckAt     time.Time
	reserved uint64
}

// NewPublisher starts the parameter service name for n float32 parameters on this
// rank, and publishes its endpoint under "roles/param/<name>". Readers on this
// host map its segment; others fetch over TCP (see WithTransport).
func NewPublisher(ctx context.Context, b collective.Bootstrap, name string, n int, opts ...Option) (*Publisher, error) {
	if err := checkName("parameter service", name); err != nil {
		return nil, err
	}
	if n < 1 || n > 1<<34 {
		return nil, errmark.Errorf(ErrInvalid, "roles: parameter service %q of %d floats: want 1 to 2^34", name, n)
	}
	opt, err := buildConfig(b, opts)
	if err != nil {
		return nil, err
	}
	p := &Publisher{name: name, n: n, closed: make(chan struct{}), change: make(chan struct{})}
	ep := endpoint{Rank: b.Rank(), Host: b.Host(), PID: os.Getpid(), Floats: n}
	switch {
	case opt.transport != TransportTCP && shmSupported:
		segName := segmentName(b, fmt.Sprintf("param.%s.%x", name, newNonce()[:4]))
		p.seg, err = createSegment(segName, paramSegSize(n))
		ep.Shm = segName
	case opt.transport == TransportShm:
		err = errNoShmTransport()
	default:
		p.seg, err = anonSegment(paramSegSize(n))
	}
	if err != nil {
		return nil, err
	}
	p.seg.initHeader(0)
	binary.LittleEndian.PutUint64(p.seg.mem[paramOffN:], uint64(n))
	atomic.StoreUint64(p.seg.u64(offMagic), paramMagic)
	if p.tcp, err = listenTCP(opt, paramMagicTCP, &ep, p.serveConn); err != nil {
		p.Close()
		return nil, err
	}
	if err := publish(ctx, b, paramKey(name), ep); err != nil {
		p.Close()
		return nil, err
	}
	p.mark = closeMark{b: b, key: paramKey(name)}
	return p, nil
}

// Publish makes params the newest version: readers that refresh afterwards get
// it whole, never half of it. Versions start at 1, are at most 2^63-1 and must
// grow; Publish may be called from several goroutines, and a version not greater
// than the last published (or than a resumed checkpoint's reservation, see
// CheckpointTo) gets ErrStaleVersion. params is copied.
//
// Errors: ErrStaleVersion; a wrong length or a version above 2^63-1 (both
// matching ErrInvalid); ErrClosed; the context's error.
func (p *Publisher) Publish(ctx context.Context, version uint64, params []float32) error {
	if len(params) != p.n {
		return errmark.Errorf(ErrInvalid, "roles: publish %d floats to parameter service %q of %d", len(params), p.name, p.n)
	}
	if version > maxVersion {
		return errmark.Errorf(ErrInvalid, "roles: parameter version %d above 2^63-1", version)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shut {
		return ErrClosed
	}
	if version <= p.last {
		return fmt.Errorf("roles: publish version %d of %q after version %d: %w", version, p.name, p.last, ErrStaleVersion)
	}
	if err := p.checkpointLocked(version, params); err != nil {
		return err
	}
	seg := p.seg
	latest := seg.u64(paramLatest)
	idx := 0
	if l := atomic.LoadUint64(latest); l != 0 {
		idx = 1 - int(l&1)
	}
	buf := paramBuf(p.n, idx)
	seq := seg.u64(buf + bufSeq)
	atomic.AddUint64(seq, 1) // odd: readers of this buffer retry; a full barrier before the writes below
	atomic.StoreUint64(seg.u64(buf+bufVersion), version)
	copy(floatsAt(seg, buf+bufData, p.n), params)
	atomic.AddUint64(seq, 1) // even again, after the writes above
	atomic.StoreUint64(latest, version<<1|uint64(idx))
	p.last = version
	notify(seg.u32(paramNotify), seg.u32(paramSleeping))
	close(p.change)
	p.change = make(chan struct{})
	return nil
}

// Version is the last version published (0 before the first).
func (p *Publisher) Version() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// Close ends the service: readers get an error matching ErrPeerClosed on their
// next fetch and every one after it, and the segment is removed. It is
// idempotent.
func (p *Publisher) Close() error {
	var err error
	p.once.Do(func() {
		p.mark.set()
		if p.tcp != nil {
			var bye [answerHeader]byte
			binary.LittleEndian.PutUint64(bye[:], paramGoodbye)
			p.tcp.goodbye(bye[:])
		}
		close(p.closed)
		p.mu.Lock()
		p.shut = true
		atomic.StoreUint32(p.seg.u32(offClosed), 1)
		p.mu.Unlock()
		p.seg.wake(paramNotify)
		if p.tcp != nil {
			p.tcp.shutdown(0)
		}
		err = p.seg.close()
	})
	return err
}

// serveConn answers one TCP reader's fetches.
func (p *Publisher) serveConn(c *tconn) {
	buf := make([]float32, p.n)
	var fw uint64
	var req [fetchSize]byte
	var hdr [answerHeader]byte
	for {
		if _, err := io.ReadFull(c, req[:]); err != nil {
			return
		}
		have, wait := binary.LittleEndian.Uint64(req[:]), req[8] != 0
		for {
			p.mu.Lock()
			change := p.change
			p.mu.Unlock()
			v, ok := readParams(p.seg, p.n, have, buf, &fw)
			if ok || !wait {
				binary.LittleEndian.PutUint64(hdr[:], v)
				var body []byte
				if ok {
					binary.LittleEndian.PutUint64(hdr[8:], uint64(p.n))
					body = floatBytes(buf)
					toLittleEndian(body)
				} else {
					binary.LittleEndian.PutUint64(hdr[8:], 0)
				}
				if err := c.write(hdr[:], body); err != nil {
					return
				}
				break
			}
			select {
			case <-change:
			case <-p.closed:
				return // close says goodbye
			}
		}
	}
}

// readParams copies into dst the newest version if it is newer than have, and
// returns it with true; otherwise it returns the newest version (0: none yet) and
// false. The copy is whole: a buffer rewritten during the copy is read again.
// fw is the caller's own fence word.
func readParams(seg *segment, n int, have uint64, dst []float32, fw *uint64) (uint64, bool) {
	latest := seg.u64(paramLatest)
	for spins := 0; ; spins++ {
		l := atomic.LoadUint64(latest)
		if l>>1 <= have {
			return l >> 1, false
		}
		buf := paramBuf(n, int(l&1))
		seq := seg.u64(buf + bufSeq)
		s1 := atomic.LoadUint64(seq)
		if s1&1 == 0 {
			v := atomic.LoadUint64(seg.u64(buf + bufVersion))
			copy(dst, floatsAt(seg, buf+bufData, n))
			fence(fw) // the copy's loads complete before the seqlock is read again
			if atomic.LoadUint64(seq) == s1 {
				return v, true
			}
		}
		if spins&7 == 7 {
			runtime.Gosched()
		}
	}
}

func floatBytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f))
}

func isLittleEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}

// toLittleEndian turns native float32 bytes into the wire's little-endian ones,
// and back: a no-op on little-endian machines.
func toLittleEndian(b []byte) {
	if isLittleEndian() {
		return
	}
	for i := 0; i+4 <= len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
}
