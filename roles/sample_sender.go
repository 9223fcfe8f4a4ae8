package roles

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gear-rl/gear/collective"
)

// SampleSender is an actor's end of a sample stream: Push delivers a trajectory
// to the trainer, blocking while the trainer's queue for this actor is full.
// It is a Sink. Concurrent Pushes take turns.
type SampleSender struct {
	clientEnd
	trainer int
	me      int
	max     int
	wg      sync.WaitGroup

	// Shared memory.
	base int
	ring uint64
	tail uint64

	// TCP (clientEnd.bye: the trainer closed the stream).
	conn    net.Conn
	credit  atomic.Uint64
	granted chan struct{} // a credit frame arrived
	hdr     [frameHeader]byte
}

var _ Sink = (*SampleSender)(nil)

// DialSamples connects to the sample stream name of world rank trainer, through
// shared memory when both are on one host and TCP otherwise (see WithTransport).
// It waits for the trainer to publish its endpoint.
//
// Errors: the context's error; ErrNoSlot when every shared-memory queue is
// taken; a *LostError naming the trainer when it dies first; connection errors.
func DialSamples(ctx context.Context, b collective.Bootstrap, name string, trainer int, opts ...Option) (*SampleSender, error) {
	if err := checkName("sample stream", name); err != nil {
		return nil, err
	}
	opt, err := buildConfig(b, opts)
	if err != nil {
		return nil, err
	}
	key := sampleKey(name, trainer)
	ep, err := lookup(ctx, b, key)
	if err != nil {
		return nil, err
	}
	s := &SampleSender{clientEnd: clientEnd{name: name, opt: opt, sem: make(chan struct{}, 1), closed: make(chan struct{})},
		trainer: trainer, me: b.Rank(), max: ep.Record}
	s.boot, s.key = b, key
	shm, err := attachLocal(opt, b, ep, key, func() error { return s.attachShm(ep, b.Rank()) })
	if err != nil {
		return nil, err
	}
	if !shm {
		conn, err := dialTCP(ctx, ep.TCP, sampleMagicTCP, ep.Nonce, b.Rank())
		if err != nil {
			if serverClosed(ctx, b, key) {
				return nil, peerClosed(roleTrainer, trainer, name)
			}
			return nil, fmt.Errorf("roles: dial sample stream %q of trainer rank %d at %s: %w", name, trainer, ep.TCP, err)
		}
		s.conn, s.addr = conn, ep.TCP
		s.granted = make(chan struct{}, 1)
		s.bye = make(chan struct{})
	}
	s.watch = watchPeer(b, roleTrainer, trainer, s.wake)
	if s.conn != nil {
		s.wg.Go(s.readCredit)
	}
	return s, nil
}

func (s *SampleSender) attachShm(ep endpoint, me int) error {
	qsize := sampleQueueSize(ep.Ring)
	seg, err := openSegment(ep.Shm, sampleHeader+ep.Slots*qsize)
	if err != nil {
		return err
	}
	if atomic.LoadUint64(seg.u64(offMagic)) != sampleMagic || binary.LittleEndian.Uint32(seg.mem[offLayout:]) != layoutV1 ||
		binary.LittleEndian.Uint64(seg.mem[sampleOffRing:]) != uint64(ep.Ring) {
		seg.close()
		return fmt.Errorf("roles: shared memory %s is not a sample stream of %d queues of %d bytes", ep.Shm, ep.Slots, ep.Ring)
	}
	for q := range ep.Slots {
		base := sampleHeader + q*qsize
		if atomic.CompareAndSwapUint32(seg.u32(base+qOwner), 0, uint32(me+1)) {
			// Records a closed sender left behind stay queued; go on after them.
			s.seg, s.base, s.ring = seg, base, uint64(ep.Ring)
			s.tail = atomic.LoadUint64(seg.u64(base + qTail))
			return nil
		}
	}
	seg.close()
	return fmt.Errorf("roles: sample stream %q of trainer rank %d: all %d queues taken: %w", s.name, s.trainer, ep.Slots, ErrNoSlot)
}

// wake interrupts a wait: the trainer was reported lost, or the sender closes.
func (s *SampleSender) wake() {
	if s.seg != nil {
		s.seg.wake(s.base + qWord)
	}
	if s.conn != nil {
		s.conn.Close()
	}
}

// MaxRecordBytes is the largest record the trainer takes.
func (s *SampleSender) MaxRecordBytes() int { return s.max }

// Insert is Push, so that a sender is a Sink.
func (s *SampleSender) Insert(ctx context.Context, rec Record) error { return s.Push(ctx, rec) }

// Push sends rec.Data and rec.Version (rec.Actor is ignored: the trainer learns
// the sender's rank) and returns once the record is queued for the trainer;
// while the queue is full it blocks, until ctx ends. rec.Data is copied.
//
// Errors: ErrTooLarge; the context's error; ErrClosed; a *LostError naming the
// trainer when it dies; an error matching ErrPeerClosed when it closed the
// stream.
func (s *SampleSender) Push(ctx context.Context, rec Record) error {
	if len(rec.Data) > s.max {
		return fmt.Errorf("roles: record of %d bytes, sample stream %q takes at most %d: %w", len(rec.Data), s.name, s.max, ErrTooLarge)
	}
	if err := s.acquire(ctx); err != nil {
		return err
	}
	defer s.release()
	if err := s.check(ctx); err != nil {
		return err
	}
	if s.seg != nil {
		return s.pushShm(ctx, rec)
	}
	return s.pushTCP(ctx, rec)
}

func (s *SampleSender) pushShm(ctx context.Context, rec Record) error {
	seg, base, ring := s.seg, s.base, s.ring
	head := seg.u64(base + qHead)
	size := uint64(frameSize(len(rec.Data)))
	need := func() uint64 {
		if rem := ring - s.tail%ring; size > rem {
			return rem + size
		}
		return size
	}
	room := func() bool { return ring-(s.tail-atomic.LoadUint64(head)) >= need() }
	if !room() {
		if err := awaitShm(ctx, seg, base+qWord, base+qSleeping, s.opt.spin, room, func() error { return s.check(ctx) }); err != nil {
			return err
		}
	}
	if rem := ring - s.tail%ring; size > rem {
		pos := base + qData + int(s.tail%ring)
		binary.LittleEndian.PutUint32(seg.mem[pos:], frameWrap)
		s.tail += rem
	}
	pos := base + qData + int(s.tail%ring)
	binary.LittleEndian.PutUint32(seg.mem[pos:], uint32(len(rec.Data)))
	binary.LittleEndian.PutUint32(seg.mem[pos+4:], uint32(s.me))
	binary.LittleEndian.PutUint64(seg.mem[pos+8:], rec.Version)
	copy(seg.mem[pos+frameHeader:], rec.Data)
	s.tail += size
	atomic.StoreUint64(seg.u64(base+qTail), s.tail)
	notify(seg.u32(sampleDoorbell), seg.u32(sampleSleeping))
	return nil
}

func (s *SampleSender) pushTCP(ctx context.Context, rec Record) error {
	fee := uint64(frameSize(len(rec.Data)))
	for {
		// The trainer's goodbye comes first: credit left over from before it
		// buys nothing, the trainer no longer reads.
		select {
		case <-s.bye:
			return peerClosed(roleTrainer, s.trainer, s.name)
		default:
		}
		if s.credit.Load() >= fee {
			break
		}
		select {
		case <-s.granted:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closed:
			return ErrClosed
		case <-s.watch.done:
			return s.watch.err()
		case <-s.bye:
			return peerClosed(roleTrainer, s.trainer, s.name)
		}
	}
	s.credit.Add(-fee)
	binary.LittleEndian.PutUint32(s.hdr[0:], uint32(len(rec.Data)))
	binary.LittleEndian.PutUint32(s.hdr[4:], uint32(s.me))
	binary.LittleEndian.PutUint64(s.hdr[8:], rec.Version)
	// The trainer has room for the frame (the credit says so), so the write
	// does not wait on it; a dead trainer's connection fails it.
	if _, err := (&net.Buffers{s.hdr[:], rec.Data}).WriteTo(s.conn); err != nil {
		return s.connErr(err)
	}
	return nil
}

// readCredit collects the trainer's credit frames. On the trainer's goodbye it
// closes bye, then half-closes the connection: the end of the sender's frames
// tells the trainer that the sender knows, and the trainer's Close waits for it,
// so that a Push after that Close fails (ErrPeerClosed) however soon it comes.
// A Push writing at that moment fails too.
func (s *SampleSender) readCredit() {
	var b [8]byte
	for {
		if _, err := io.ReadFull(s.conn, b[:]); err != nil {
			s.connErr(err)
			return
		}
		n := binary.LittleEndian.Uint64(b[:])
		if n == goodbyeCredit {
			s.sayBye()
			if tc, ok := s.conn.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			return
		}
		s.credit.Add(n)
		select {
		case s.granted <- struct{}{}:
		default:
		}
	}
}

// Close detaches from the stream; a Push in progress returns ErrClosed.
// Records already pushed stay queued for the trainer: over TCP, Close half-closes
// the connection and waits (up to a second) for the trainer to read them. It is
// idempotent.
func (s *SampleSender) Close() error {
	var err error
	s.once.Do(func() {
		close(s.closed)
		s.watch.stop()
		if s.seg != nil {
			s.seg.wake(s.base + qWord)
		}
		s.sem <- struct{}{} // no Push runs past this point
		if s.seg != nil {
			atomic.StoreUint32(s.seg.u32(s.base+qOwner), 0)
			err = s.seg.close()
		}
		if s.conn != nil {
			if tc, ok := s.conn.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			s.conn.SetReadDeadline(time.Now().Add(goodbyeDeadline))
			s.wg.Wait()
			if cerr := s.conn.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) {
				err = cerr
			}
		}
	})
	return err
}
