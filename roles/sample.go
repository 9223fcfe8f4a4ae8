package roles

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"github.com/gear-rl/gear/collective"
)

// Record is one finished trajectory on its way from an actor to a trainer.
type Record struct {
	// Actor is the world rank of the actor that pushed it (set by the receiver).
	Actor int
	// Version is the parameter version the trajectory was generated with.
	Version uint64
	// Data is the trajectory, encoded by the caller.
	Data []byte
}

// Sink takes trajectories. A SampleSender is one (it pushes them to a trainer);
// a replay table shard on the actor's own host can be another, written in place.
// Insert may block (a full queue, a rate limiter) until ctx ends; it must not
// keep rec.Data after it returns.
type Sink interface {
	Insert(ctx context.Context, rec Record) error
}

// SinkFunc adapts a function to Sink.
type SinkFunc func(ctx context.Context, rec Record) error

// Insert calls f.
func (f SinkFunc) Insert(ctx context.Context, rec Record) error { return f(ctx, rec) }

// SampleConfig describes a trainer's sample stream.
type SampleConfig struct {
	// MaxRecordBytes is the size of the largest trajectory (default 256 KiB).
	MaxRecordBytes int
	// QueueBytes bounds what one sender may have in flight: the bytes of its
	// shared-memory queue, or of its TCP credit (default: room for four records
	// of MaxRecordBytes; at least room for two). Each record takes its size plus
	// 16 bytes, rounded up to 64.
	QueueBytes int
	// Senders is the number of shared-memory senders the receiver takes (default
	// 16); TCP senders are not limited.
	Senders int
}

func frameSize(n int) int { return align64(frameHeader + n) }

func (c SampleConfig) withDefaults() SampleConfig {
	if c.MaxRecordBytes == 0 {
		c.MaxRecordBytes = 256 << 10
	}
	if c.QueueBytes == 0 && c.MaxRecordBytes > 0 {
		c.QueueBytes = 4 * frameSize(c.MaxRecordBytes)
	}
	c.QueueBytes = align64(c.QueueBytes)
	if c.Senders == 0 {
		c.Senders = 16
	}
	return c
}

// Validate names the first field that is out of range.
func (c SampleConfig) Validate() error {
	switch {
	case c.MaxRecordBytes < 1 || c.MaxRecordBytes > 1<<30:
		return fmt.Errorf("roles: SampleConfig.MaxRecordBytes %d: want 1 to 1GiB", c.MaxRecordBytes)
	case c.QueueBytes < 2*frameSize(c.MaxRecordBytes) || c.QueueBytes > 1<<32:
		return fmt.Errorf("roles: SampleConfig.QueueBytes %d: want room for two records of MaxRecordBytes (%d) and at most 4GiB", c.QueueBytes, 2*frameSize(c.MaxRecordBytes))
	case c.Senders < 1 || c.Senders > 1<<16:
		return fmt.Errorf("roles: SampleConfig.Senders %d: want 1 to 65536", c.Senders)
	}
	return nil
}

// Layout of a sample segment: the common header (slots in the kind word), then
//
//	32   ring capacity u64, 40 largest record u64
//	192  doorbell u32: the futex word the receiver sleeps on; senders bump it
//	256  receiver sleeping u32
//	512  queue 0, queue 1, ...
//
// and in each queue, a single-producer single-consumer ring of frames:
//
//	+0    owner u32: 0 free, else the sender's world rank + 1
//	+64   head u64: bytes consumed, written by the receiver
//	+128  tail u64: bytes produced, written by the sender
//	+192  sender futex word u32; +224 sender sleeping u32
//	+256  ring
//
// Head and tail only grow. A frame is length u32, the sender's world rank u32,
// version u64 and the record, padded to 64 bytes (the rank travels in the frame
// because a sender may close and leave its records queued). A frame never wraps
// around the end of the ring: a sender that would cross the end writes a wrap
// frame (length frameWrap) and starts again at the beginning. A record up to half
// the ring always fits an empty ring.
const (
	sampleMagic    = 0x316d7073_72616567 // "gearspm1"
	sampleOffRing  = 32
	sampleOffMax   = 40
	sampleDoorbell = 192
	sampleSleeping = 256
	sampleHeader   = 512

	qOwner    = 0
	qHead     = 64
	qTail     = 128
	qWord     = 192
	qSleeping = 224
	qData     = 256

	frameHeader = 16
	frameWrap   = ^uint32(0)
)

func sampleQueueSize(ring int) int { return qData + ring }

// TCP framing of a sample stream: the sender writes frames as in the ring
// (length u32, rank u32, version u64, record, without padding); the receiver
// writes credit u64 frames, the bytes the sender may send (each record costing
// its ring frame size), the first one QueueBytes; credit goodbyeCredit says the
// receiver closed.
const (
	sampleMagicTCP = "GRS1"
	goodbyeCredit  = ^uint64(0)
)

// SampleReceiver is the trainer's end of a sample stream: Recv returns the
// trajectories that the actors pushed, in order for each actor.
type SampleReceiver struct {
	name   string
	cfg    SampleConfig
	opt    config
	closed chan struct{}
	once   sync.Once
	mark   closeMark
	wg     sync.WaitGroup
	// sem is held by Recv, and by Close before it unmaps.
	sem chan struct{}

	seg      *segment
	ring     int
	qsize    int
	cursor   []uint64 // per queue: bytes consumed, held records included
	heldQ    int      // queue of the record Recv returned last, or -1
	heldSize int
	next     int // queue to look at first
	rearm    chan struct{}
	shmReady chan struct{}

	tcp      *tcpServer
	tcpRecs  chan tcpRecord
	tcpFirst bool
	heldTCP  *sampleConn
	heldFee  uint64
}

type tcpRecord struct {
	rec  Record
	from *sampleConn
	fee  uint64
}

// NewSampleReceiver starts the sample stream name of this rank (a trainer) and
// publishes its endpoint under "roles/sample/<name>/<rank>".
func NewSampleReceiver(ctx context.Context, b collective.Bootstrap, name string, cfg SampleConfig, opts ...Option) (*SampleReceiver, error) {
	if err := checkName("sample stream", name); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opt, err := buildConfig(b, opts)
	if err != nil {
		return nil, err
	}
	r := &SampleReceiver{name: name, cfg: cfg, opt: opt, closed: make(chan struct{}), sem: make(chan struct{}, 1),
		heldQ: -1, tcpRecs: make(chan tcpRecord, 64)}
	ep := endpoint{Rank: b.Rank(), Host: b.Host(), PID: os.Getpid(), Slots: cfg.Senders, Ring: cfg.QueueBytes, Record: cfg.MaxRecordBytes}
	if opt.transport != TransportTCP && shmSupported {
		r.ring, r.qsize = cfg.QueueBytes, sampleQueueSize(cfg.QueueBytes)
		segName := segmentName(b, fmt.Sprintf("sample.%s.r%d.%x", name, b.Rank(), newNonce()[:4]))
		seg, err := createSegment(segName, sampleHeader+cfg.Senders*r.qsize)
		if err != nil {
			return nil, err
		}
		r.seg = seg
		seg.initHeader(uint32(cfg.Senders))
		binary.LittleEndian.PutUint64(seg.mem[sampleOffRing:], uint64(r.ring))
		binary.LittleEndian.PutUint64(seg.mem[sampleOffMax:], uint64(cfg.MaxRecordBytes))
		atomic.StoreUint64(seg.u64(offMagic), sampleMagic)
		r.cursor = make([]uint64, cfg.Senders)
		r.rearm = make(chan struct{}, 1)
		r.shmReady = make(chan struct{}, 1)
		ep.Shm = segName
		r.wg.Go(r.watchShm)
	} else if opt.transport == TransportShm {
		return nil, errNoShmTransport()
	}
	if r.tcp, err = listenTCP(opt, sampleMagicTCP, &ep, r.serveConn); err != nil {
		r.Close()
		return nil, err
	}
	if err := publish(ctx, b, sampleKey(name, b.Rank()), ep); err != nil {
		r.Close()
		return nil, err
	}
	r.mark = closeMark{b: b, key: sampleKey(name, b.Rank())}
	return r, nil
}

// Config is the receiver's configuration, defaults filled in.
func (r *SampleReceiver) Config() SampleConfig { return r.cfg }

// Recv returns the next trajectory of any actor (actors take turns). The record
// it returned before is released first: rec.Data is a view into the stream's
// buffers (shared memory for local actors), valid until the next Recv or Close.
// Until Recv is called again, that record's room stays taken, which is how a
// trainer that falls behind slows its actors down.
//
// Errors: ErrClosed; the context's error.
func (r *SampleReceiver) Recv(ctx context.Context) (Record, error) {
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		return Record{}, ctx.Err()
	case <-r.closed:
		return Record{}, ErrClosed
	}
	defer func() { <-r.sem }()
	r.release()
	for {
		select {
		case <-r.closed:
			return Record{}, ErrClosed
		default:
		}
		// Local and remote actors take turns: neither kind can starve the other.
		r.tcpFirst = !r.tcpFirst
		if r.tcpFirst {
			select {
			case t := <-r.tcpRecs:
				return r.hold(t), nil
			default:
			}
		}
		if rec, ok := r.pollShm(); ok {
			return rec, nil
		}
		select {
		case t := <-r.tcpRecs:
			return r.hold(t), nil
		default:
		}
		if err := ctx.Err(); err != nil {
			return Record{}, err
		}
		if r.seg != nil {
			select {
			case r.rearm <- struct{}{}:
			default:
			}
		}
		select {
		case t := <-r.tcpRecs:
			return r.hold(t), nil
		case <-r.shmReady:
		case <-ctx.Done():
			return Record{}, ctx.Err()
		case <-r.closed:
			return Record{}, ErrClosed
		}
	}
}

// Serve receives trajectories and inserts each into sink, until ctx ends or the
// receiver is closed (then it returns nil). A blocking Insert (a rate limiter)
// holds the stream back, and with it the actors. The first error of sink ends
// Serve.
func (r *SampleReceiver) Serve(ctx context.Context, sink Sink) error {
	for {
		rec, err := r.Recv(ctx)
		if errors.Is(err, ErrClosed) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := sink.Insert(ctx, rec); err != nil {
			return err
		}
	}
}

// release gives back the room of the record returned last.
func (r *SampleReceiver) release() {
	if r.heldQ >= 0 {
		q := r.heldQ
		r.cursor[q] += uint64(r.heldSize)
		r.advance(q)
		r.heldQ = -1
	}
	if r.heldTCP != nil {
		r.heldTCP.credit(r.heldFee)
		r.heldTCP = nil
	}
}

// advance publishes queue q's consumed position and wakes its sender.
func (r *SampleReceiver) advance(q int) {
	base := sampleHeader + q*r.qsize
	atomic.StoreUint64(r.seg.u64(base+qHead), r.cursor[q])
	notify(r.seg.u32(base+qWord), r.seg.u32(base+qSleeping))
}

func (r *SampleReceiver) hold(t tcpRecord) Record {
	r.heldTCP, r.heldFee = t.from, t.fee
	return t.rec
}

// pollShm takes the next record of the shared-memory queues, if any.
func (r *SampleReceiver) pollShm() (Record, bool) {
	if r.seg == nil {
		return Record{}, false
	}
	seg, ring := r.seg, uint64(r.ring)
	n := r.cfg.Senders
	for k := range n {
		q := (r.next + k) % n
		base := sampleHeader + q*r.qsize
		for {
			tail := atomic.LoadUint64(seg.u64(base + qTail))
			head := r.cursor[q]
			if tail == head {
				break
			}
			pos := base + qData + int(head%ring)
			h := seg.mem[pos : pos+frameHeader]
			size := binary.LittleEndian.Uint32(h[0:])
			if size == frameWrap {
				r.cursor[q] += ring - head%ring
				r.advance(q)
				continue
			}
			fs := frameSize(int(size))
			r.heldQ, r.heldSize = q, fs
			r.next = (q + 1) % n
			data := seg.mem[pos+frameHeader : pos+frameHeader+int(size) : pos+frameHeader+int(size)]
			return Record{Actor: int(binary.LittleEndian.Uint32(h[4:])), Version: binary.LittleEndian.Uint64(h[8:]), Data: data}, true
		}
	}
	return Record{}, false
}

// watchShm tells Recv when a shared-memory queue has something: each time Recv
// rearms it, it sleeps on the doorbell until some queue is not empty.
func (r *SampleReceiver) watchShm() {
	seg := r.seg
	n := r.cfg.Senders
	nonEmpty := func() bool {
		for q := range n {
			base := sampleHeader + q*r.qsize
			if atomic.LoadUint64(seg.u64(base+qTail)) != atomic.LoadUint64(seg.u64(base+qHead)) {
				return true
			}
		}
		return false
	}
	check := func() error {
		select {
		case <-r.closed:
			return ErrClosed
		default:
			return nil
		}
	}
	for {
		select {
		case <-r.rearm:
		case <-r.closed:
			return
		}
		if err := awaitShm(context.Background(), seg, sampleDoorbell, sampleSleeping, r.opt.spin, nonEmpty, check); err != nil {
			return
		}
		select {
		case r.shmReady <- struct{}{}:
		default:
		}
	}
}

// Close ends the stream: senders get an error matching ErrPeerClosed from every
// Push that is waiting or comes after Close returns, the segment is removed, and
// the goroutines are joined. Close waits (up to a second) for each TCP sender to
// acknowledge that the stream closed. The record Recv returned last becomes
// invalid. It is idempotent.
func (r *SampleReceiver) Close() error {
	var err error
	r.once.Do(func() {
		r.mark.set()
		if r.tcp != nil {
			var bye [8]byte
			binary.LittleEndian.PutUint64(bye[:], goodbyeCredit)
			r.tcp.goodbye(bye[:])
		}
		close(r.closed)
		if r.seg != nil {
			atomic.StoreUint32(r.seg.u32(offClosed), 1)
			r.seg.wake(sampleDoorbell)
			for q := range r.cfg.Senders {
				r.seg.wake(sampleHeader + q*r.qsize + qWord)
			}
		}
		if r.tcp != nil {
			// Each TCP sender acknowledges the goodbye once it has noted it
			// (see readCredit), so that its Pushes after this Close fail.
			r.tcp.shutdown(goodbyeDeadline)
		}
		r.wg.Wait()
		r.sem <- struct{}{} // no Recv runs past this point
		if r.seg != nil {
			err = r.seg.close()
		}
	})
	return err
}

// sampleConn is the receiver's side of one TCP sender.
type sampleConn struct {
	c      *tconn
	owed   atomic.Uint64 // credit released by Recv, not yet sent
	wakeup chan struct{}
	taken  atomic.Uint64 // credit sent
}

// credit gives n bytes of room back to the sender.
func (sc *sampleConn) credit(n uint64) {
	sc.owed.Add(n)
	select {
	case sc.wakeup <- struct{}{}:
	default:
	}
}

func (r *SampleReceiver) serveConn(c *tconn) {
	sc := &sampleConn{c: c, wakeup: make(chan struct{}, 1)}
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(done)
		wg.Wait()
	}()
	sc.credit(uint64(r.cfg.QueueBytes))
	// The credit writer: Recv hands room back from its own goroutine, and must
	// not block on a slow connection.
	wg.Go(func() {
		var b [8]byte
		for {
			select {
			case <-sc.wakeup:
			case <-done:
				return
			}
			if n := sc.owed.Swap(0); n > 0 {
				sc.taken.Add(n)
				binary.LittleEndian.PutUint64(b[:], n)
				if c.write(b[:]) != nil {
					return
				}
			}
		}
	})
	var h [frameHeader]byte
	var used uint64 // bytes of credit the sender spent
	for {
		if _, err := io.ReadFull(c, h[:]); err != nil {
			return
		}
		n := int(binary.LittleEndian.Uint32(h[0:]))
		fee := uint64(frameSize(n))
		if n > r.cfg.MaxRecordBytes || used+fee > sc.taken.Load() {
			return // the sender checks sizes and credit; this one breaks the protocol
		}
		used += fee
		data := make([]byte, n)
		if _, err := io.ReadFull(c, data); err != nil {
			return
		}
		t := tcpRecord{rec: Record{Actor: c.peer, Version: binary.LittleEndian.Uint64(h[8:]), Data: data}, from: sc, fee: fee}
		select {
		case r.tcpRecs <- t:
		case <-r.closed:
			// Closing: drop the frames until the sender ends its side, which
			// acknowledges the goodbye (Close waits for it).
		}
	}
}
