package cuda

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
)

// A Ring carries fixed-size slots of experience from one producer process to
// one consumer process on the same GPU through device memory (GMI-DRL's
// channel-based experience sharing between GMIs): the consumer allocates the
// ring and exports it with CUDA IPC, the producer opens it and copies slots
// in device to device. The ring's memory starts with two counters, head (slots
// the consumer has taken) at byte 0 and tail (slots the producer has put) at
// byte 64, followed by Slots slots of SlotBytes. Each side writes only its own
// counter, after its copies are complete, and reads the other's.
//
// A caller does: on the consumer, NewRing, Handle (send its Encode to the
// producer), then Take in a loop; on the producer, OpenRing with the decoded
// handle, then Put (from device memory) or PutHost. Close the producer before
// the consumer's Close frees the ring.

const ringHeader = 128

// RingSpec is the shape of a ring.
type RingSpec struct {
	Slots, SlotBytes int
}

func (s RingSpec) check() error {
	if s.Slots < 1 || s.SlotBytes < 1 || s.SlotBytes%16 != 0 {
		return fmt.Errorf("cuda: ring of %d slots of %d bytes: want at least one slot of a positive multiple of 16 bytes", s.Slots, s.SlotBytes)
	}
	return nil
}

// RingHandle is what a producer needs to open a ring.
type RingHandle struct {
	IPC  IPCHandle
	Spec RingSpec
}

// Encode is the handle as text (hex), for an environment variable or a message.
func (h RingHandle) Encode() string {
	b := make([]byte, 64+16)
	copy(b, h.IPC.Reserved[:])
	binary.LittleEndian.PutUint64(b[64:], uint64(h.Spec.Slots))
	binary.LittleEndian.PutUint64(b[72:], uint64(h.Spec.SlotBytes))
	return hex.EncodeToString(b)
}

// DecodeRingHandle parses Encode's text.
func DecodeRingHandle(s string) (RingHandle, error) {
	var h RingHandle
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 80 {
		return h, fmt.Errorf("cuda: ring handle %.20q...: want 160 hex digits", s)
	}
	copy(h.IPC.Reserved[:], b)
	h.Spec = RingSpec{Slots: int(binary.LittleEndian.Uint64(b[64:])), SlotBytes: int(binary.LittleEndian.Uint64(b[72:]))}
	return h, h.Spec.check()
}

// ringEnd is what both ends share: the ring's memory here, a stream and a
// pinned word for the counters.
type ringEnd struct {
	dev   *Device
	spec  RingSpec
	mem   DevicePtr
	st    Stream
	word  []byte // pinned, 8 bytes
	count uint64 // this end's counter
	seen  uint64 // the other end's counter when last read
}

func (e *ringEnd) open(dev *Device, spec RingSpec) error {
	e.dev, e.spec = dev, spec
	var err error
	if e.st, err = dev.NewStream(); err != nil {
		return err
	}
	e.word, err = dev.AllocHost(8)
	return err
}

func (e *ringEnd) close() error {
	var errs []error
	if e.st != 0 {
		errs = append(errs, e.dev.DestroyStream(e.st))
	}
	if e.word != nil {
		errs = append(errs, e.dev.FreeHost(e.word))
	}
	return errors.Join(errs...)
}

func (e *ringEnd) read(off int) (uint64, error) {
	if err := e.dev.CopyDtoH(e.word, e.mem.Add(off)); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(e.word), nil
}

// publish enqueues the write of this end's counter (at off) after the copies
// already on the end's stream, which runs them in order, and waits for all of
// them: one synchronization for a Put or a Take.
func (e *ringEnd) publish(off int, v uint64) error {
	binary.LittleEndian.PutUint64(e.word, v)
	if err := e.dev.CopyHtoDAsync(e.mem.Add(off), e.word, e.st); err != nil {
		return err
	}
	return e.dev.StreamSynchronize(context.Background(), e.st)
}

// wait returns the other end's counter (at off) once ready(v) holds. The
// counter only grows, so the value last read answers while it is ready;
// otherwise it polls the device (spinning, then sleeping: poll).
func (e *ringEnd) wait(ctx context.Context, off int, ready func(uint64) bool) (uint64, error) {
	if ready(e.seen) {
		return e.seen, nil
	}
	err := poll(ctx, nil, func() (bool, error) {
		v, err := e.read(off)
		if err != nil {
			return false, err
		}
		e.seen = v
		return ready(v), nil
	})
	return e.seen, err
}

// slots enqueues the copies of n slots between the ring (starting at slot
// index first, wrapping) and linear memory at lin on the end's stream: into
// the ring when in is set. publish waits for them.
func (e *ringEnd) slots(lin DevicePtr, first uint64, n int, in bool) error {
	sb := e.spec.SlotBytes
	for n > 0 {
		at := int(first % uint64(e.spec.Slots))
		k := min(n, e.spec.Slots-at)
		ring := e.mem.Add(ringHeader + at*sb)
		src, dst := ring, lin
		if in {
			src, dst = lin, ring
		}
		if err := e.dev.CopyDtoDAsync(dst, src, k*sb, e.st); err != nil {
			return err
		}
		lin, first, n = lin.Add(k*sb), first+uint64(k), n-k
	}
	return nil
}

// RingConsumer is the consumer's end: it owns the ring's memory.
type RingConsumer struct {
	ringEnd
}

// NewRing allocates an empty ring on dev.
func (dev *Device) NewRing(spec RingSpec) (*RingConsumer, error) {
	if err := spec.check(); err != nil {
		return nil, err
	}
	r := &RingConsumer{}
	if err := r.open(dev, spec); err != nil {
		return nil, errors.Join(err, r.Close())
	}
	var err error
	if r.mem, err = dev.Alloc(ringHeader + spec.Slots*spec.SlotBytes); err != nil {
		return nil, errors.Join(err, r.Close())
	}
	if err := dev.MemsetAsync(r.mem, 0, ringHeader, r.st); err != nil {
		return nil, errors.Join(err, r.Close())
	}
	if err := dev.StreamSynchronize(context.Background(), r.st); err != nil {
		return nil, errors.Join(err, r.Close())
	}
	return r, nil
}

// Handle exports the ring for its producer.
func (r *RingConsumer) Handle() (RingHandle, error) {
	h, err := r.dev.IPCHandle(r.mem)
	return RingHandle{IPC: h, Spec: r.spec}, err
}

// Take waits until the producer has put at least one slot, or ctx ends, then
// copies up to max slots, in order, to dst in device memory (max·SlotBytes)
// and frees them in the ring. It returns the number of slots taken.
func (r *RingConsumer) Take(ctx context.Context, dst DevicePtr, max int) (int, error) {
	if max < 1 {
		return 0, fmt.Errorf("cuda: ring: Take of %d slots", max)
	}
	tail, err := r.wait(ctx, 64, func(t uint64) bool { return t > r.count })
	if err != nil {
		return 0, err
	}
	n := int(min(tail-r.count, uint64(max)))
	if err := r.slots(dst, r.count, n, false); err != nil {
		return 0, err
	}
	r.count += uint64(n)
	return n, r.publish(0, r.count)
}

// Close frees the ring. Its producer must have closed first.
func (r *RingConsumer) Close() error {
	var err error
	if r.mem != 0 {
		err = r.dev.Free(r.mem)
		r.mem = 0
	}
	return errors.Join(err, r.close())
}

// RingProducer is the producer's end.
type RingProducer struct {
	ringEnd
	stage DevicePtr // PutHost's staging slots
}

// OpenRing opens the ring another process made (h from its Handle).
func (dev *Device) OpenRing(h RingHandle) (*RingProducer, error) {
	if err := h.Spec.check(); err != nil {
		return nil, err
	}
	p := &RingProducer{}
	if err := p.open(dev, h.Spec); err != nil {
		return nil, errors.Join(err, p.Close())
	}
	var err error
	if p.mem, err = dev.OpenIPC(h.IPC); err != nil {
		return nil, errors.Join(err, p.Close())
	}
	if p.count, err = p.read(64); err != nil {
		return nil, errors.Join(err, p.Close())
	}
	if p.seen, err = p.read(0); err != nil {
		return nil, errors.Join(err, p.Close())
	}
	return p, nil
}

// Put copies n slots from src in device memory (n·SlotBytes) into the ring,
// waiting for room as the consumer takes slots, and returns once the consumer
// can see them all.
func (p *RingProducer) Put(ctx context.Context, src DevicePtr, n int) error {
	for n > 0 {
		head, err := p.wait(ctx, 0, func(h uint64) bool { return p.count-h < uint64(p.spec.Slots) })
		if err != nil {
			return err
		}
		k := min(n, p.spec.Slots-int(p.count-head))
		if err := p.slots(src, p.count, k, true); err != nil {
			return err
		}
		p.count += uint64(k)
		if err := p.publish(64, p.count); err != nil {
			return err
		}
		src, n = src.Add(k*p.spec.SlotBytes), n-k
	}
	return nil
}

// PutHost is Put from host memory: len(src) must be a multiple of SlotBytes.
// Pinned memory (AllocHost) copies fastest.
func (p *RingProducer) PutHost(ctx context.Context, src []byte) error {
	sb := p.spec.SlotBytes
	if len(src)%sb != 0 {
		return fmt.Errorf("cuda: ring: %d bytes is not a whole number of %d-byte slots", len(src), sb)
	}
	if p.stage == 0 {
		var err error
		if p.stage, err = p.dev.Alloc(p.spec.Slots * sb); err != nil {
			return err
		}
	}
	for len(src) > 0 {
		k := min(len(src)/sb, p.spec.Slots)
		if err := p.dev.CopyHtoD(p.stage, src[:k*sb]); err != nil {
			return err
		}
		if err := p.Put(ctx, p.stage, k); err != nil {
			return err
		}
		src = src[k*sb:]
	}
	return nil
}

// Close unmaps the ring and frees the producer's buffers.
func (p *RingProducer) Close() error {
	var errs []error
	if p.stage != 0 {
		errs = append(errs, p.dev.Free(p.stage))
		p.stage = 0
	}
	if p.mem != 0 {
		errs = append(errs, p.dev.CloseIPC(p.mem))
		p.mem = 0
	}
	return errors.Join(append(errs, p.close())...)
}
