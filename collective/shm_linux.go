//go:build linux

package collective

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/internal/futex"
)

// The shared-memory transport. Every rank of a host owns one segment per
// communicator, its inbox: a control block and one single-producer single-consumer
// ring per local peer, written by that peer and read by the owner. The layout:
//
//	0      magic u64, version u32, slots u32, ring capacity u64, pid u64, key u64
//	128    doorbell u32: the futex word the owner sleeps on
//	256    sleeping u32: 1 while the owner sleeps (or is about to)
//	384    closed u32: 1 once the owner closed the communicator
//	512    note length u32, then the note: why the owner's communicator failed
//	4096   live u32 per slot: 1 once the slot's producer sent its first frame
//	ctl    slot 0, slot 1, ...: ring head u64 at +0, data at +256
//
// where ctl is 4096 plus the live words, rounded up to a page, 8192 at least
// (shmCtlBytes); an inbox is rounded up to a page. The board (board_linux.go)
// follows the inboxes.
// Nothing is populated: a page of the segment takes memory when it is first
// touched, so a ring that no frame ever crosses costs address space only, and
// a rank that waits looks at a ring only once its live word says a frame was
// sent there. Setting a communicator up touches the control blocks alone.
//
// Positions are byte counts that only grow. The head, the consumer's position,
// sits on its own pair of cache lines; the producer reads it only when its cached
// copy says the ring is full. A frame is a mark (u64), a 32-byte header and the
// payload, padded to 64 bytes; it never wraps around the end of the ring (a
// producer that would cross the end writes a wrap marker and starts again at the
// beginning). The producer writes the mark last: the frame's position plus one. A
// consumer polls the mark where its next frame will start, so that a small frame's
// mark, header and payload arrive in one cache line. Marks are XORed with a random
// key of the inbox, so that stale bytes left in the ring from an earlier lap (a
// payload holding just the right integer) do not pass for a frame.
//
// Waiting spins on the position word for a while (unless the host is
// oversubscribed), then announces itself in the sleeping word and sleeps on the
// doorbell with FUTEX_WAIT; the other side rings the doorbell only when the
// sleeping word says so, so that the fast path makes no system call.
const (
	shmMagic    = 0x6c6c6f63_72616567 // "gearcoll", little-endian
	shmVersion  = 3
	offLive     = 4096 // the live words; the note ends here
	shmPage     = 4096
	offNote     = 512
	shmRingHdr  = 256
	offDoorbell = 128
	offSleeping = 256
	offClosed   = 384
	shmDir      = "/dev/shm/"
	frameAlign  = 64
	markSize    = 8
	prefixSize  = markSize + headerSize // before the payload
	sleepSlice  = 50 * time.Millisecond // longest futex sleep between checks
	// pureSpin is how long a wait spins before it starts yielding the CPU:
	// longer than a peer on another core takes to answer, shorter than a
	// scheduler's time slice, which a spinning rank would otherwise burn while
	// its peer waits for this very CPU.
	pureSpin = 50 * time.Microsecond
)

func align64(n int) int { return (n + frameAlign - 1) &^ (frameAlign - 1) }

// shmCtlBytes is the size of an inbox's control block: the fixed part and a
// live word per slot, rounded up to a page.
func shmCtlBytes(slots int) int64 {
	return (offLive + 4*max(int64(slots), 1) + shmPage - 1) &^ (shmPage - 1)
}

// shmSegmentBytes is the size of one inbox, rounded up to a page: inboxes lie
// back to back in the host's segment.
func shmSegmentBytes(slots, ringCap int) int64 {
	n := shmCtlBytes(slots) + int64(slots)*(shmRingHdr+int64(ringCap))
	return (n + shmPage - 1) &^ (shmPage - 1)
}

// hostSegmentBytes is the size of the host's segment: every rank's inbox, then
// the board.
func hostSegmentBytes(slots, ringCap int) int64 {
	return shmSegmentBytes(slots, ringCap)*int64(slots) + boardBytes(slots)
}

// shmSegment is one rank's inbox: a window of the host's segment.
type shmSegment struct {
	mem []byte
}

func u32at(mem []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }
func u64at(mem []byte, off int) *uint64 { return (*uint64)(unsafe.Pointer(&mem[off])) }

// createHostSegment makes and maps the segment that holds the inboxes of every
// local rank of a communicator, and writes their headers (each with the pid of
// its owner and a random key); it fails if the name exists. The lowest local
// rank makes it, and the others map it once it exists (openHostSegment): one
// file and one mapping per rank, however many ranks share the host. Nothing is
// populated: the headers' pages are what setting up touches, and a ring's pages
// come when frames cross them.
func createHostSegment(name string, peers []shmPeer, ringCap int) ([]byte, error) {
	slots := len(peers)
	inbox := shmSegmentBytes(slots, ringCap)
	size := hostSegmentBytes(slots, ringCap)
	if size != int64(int(size)) {
		return nil, fmt.Errorf("collective: shared memory %s: %d inboxes of %d bytes do not fit in memory", name, slots, inbox)
	}
	fd, err := unix.Open(shmDir+name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("collective: create shared memory %s: %w", name, err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Unlink(shmDir + name)
		return nil, fmt.Errorf("collective: size shared memory %s to %d bytes: %w", name, size, err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Unlink(shmDir + name)
		return nil, fmt.Errorf("collective: map shared memory %s: %w", name, err)
	}
	keys := make([]byte, 8*slots)
	rand.Read(keys)
	for i, p := range peers {
		m := mem[int64(i)*inbox:]
		binary.LittleEndian.PutUint32(m[8:], shmVersion)
		binary.LittleEndian.PutUint32(m[12:], uint32(slots))
		binary.LittleEndian.PutUint64(m[16:], uint64(ringCap))
		binary.LittleEndian.PutUint64(m[24:], uint64(p.pid))
		copy(m[32:40], keys[8*i:])
		atomic.StoreUint64(u64at(m, 0), shmMagic)
	}
	return mem, nil
}

// openHostSegment maps the host's segment that another rank made and checks
// its layout.
func openHostSegment(name string, slots, ringCap int) ([]byte, error) {
	inbox := shmSegmentBytes(slots, ringCap)
	size := hostSegmentBytes(slots, ringCap)
	fd, err := unix.Open(shmDir+name, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("collective: open shared memory %s: %w", name, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("collective: stat shared memory %s: %w", name, err)
	}
	if st.Size != size || size != int64(int(size)) {
		return nil, fmt.Errorf("collective: shared memory %s has %d bytes, want %d (ranks disagree on the ring size)", name, st.Size, size)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("collective: map shared memory %s: %w", name, err)
	}
	for i := range slots {
		m := mem[int64(i)*inbox:]
		if atomic.LoadUint64(u64at(m, 0)) != shmMagic || binary.LittleEndian.Uint32(m[8:]) != shmVersion ||
			binary.LittleEndian.Uint32(m[12:]) != uint32(slots) || binary.LittleEndian.Uint64(m[16:]) != uint64(ringCap) {
			unix.Munmap(mem)
			return nil, fmt.Errorf("collective: shared memory %s: inbox %d is not a collective inbox of %d rings of %d bytes", name, i, slots, ringCap)
		}
	}
	return mem, nil
}

func (s *shmSegment) doorbell() *uint32  { return u32at(s.mem, offDoorbell) }
func (s *shmSegment) key() uint64        { return binary.LittleEndian.Uint64(s.mem[32:]) }
func (s *shmSegment) sleeping() *uint32  { return u32at(s.mem, offSleeping) }
func (s *shmSegment) closed() *uint32    { return u32at(s.mem, offClosed) }
func (s *shmSegment) live(i int) *uint32 { return u32at(s.mem, offLive+4*i) }

// ringOf returns the head word and the data of slot i of an inbox of slots.
func (s *shmSegment) ringOf(i, slots, ringCap int) (head *uint64, data []byte) {
	base := int(shmCtlBytes(slots)) + i*(shmRingHdr+ringCap)
	return u64at(s.mem, base), s.mem[base+shmRingHdr : base+shmRingHdr+ringCap : base+shmRingHdr+ringCap]
}

// wake rings the owner's doorbell if it sleeps: a frame for it.
func (s *shmSegment) wake() {
	if atomic.LoadUint32(s.sleeping()) != sleepingNot {
		atomic.AddUint32(s.doorbell(), 1)
		futex.Wake(s.doorbell(), 1<<30)
	}
}

// wakeForRoom rings the owner's doorbell if it sleeps until a ring to a peer
// has room: a rank that sleeps for a frame has no use for the news that its
// peer read one of its own (each read woke it for nothing, and a sleeping rank
// pays a switch to look).
func (s *shmSegment) wakeForRoom() {
	if atomic.LoadUint32(s.sleeping()) == sleepingForRoom {
		atomic.AddUint32(s.doorbell(), 1)
		futex.Wake(s.doorbell(), 1<<30)
	}
}

// What a rank's sleeping word says.
const (
	sleepingNot     = 0
	sleepingForData = 1 // a frame from some peer
	sleepingForRoom = 2 // room in the ring to a peer
)

// shmPeer is what a rank needs to know about a rank of its host.
type shmPeer struct {
	rank int // communicator rank
	seg  string
	pid  int
}

// shmTransport connects the ranks of one host. Its links are indexed by local index.
type shmTransport struct {
	me      int
	peers   []shmPeer
	name    string        // the host segment's, made by local rank 0 (peers[0].seg)
	mem     []byte        // the host segment: every local rank's inbox
	segs    []*shmSegment // by local index; segs[me] is the inbox
	board   *board        // the host's board (board_linux.go)
	links   []*shmLink
	pidfds  []int // by local index: -1 not opened yet, -2 none
	ringCap int
	maxP    int
	spin    time.Duration
	yield   bool // oversubscribed host: poll with sched_yield rather than spin
	// boardSpin is how long a board wait polls before it sleeps
	// (Tuning.boardSpinFor).
	boardSpin time.Duration
	gosched   bool // some peers are goroutines of this process: yield to them
	sig       *signals
	pool      *bufPool
	lost      func(rank int, reason string) error

	// mu orders interrupt, which other goroutines call (a failure notice, a
	// context's end), with close, which unmaps the memory interrupt writes.
	mu     sync.Mutex
	closed bool
}

var _ transport = (*shmTransport)(nil)
var _ link = (*shmLink)(nil)

// newShmTransport starts the shared-memory transport of local rank me: local
// rank 0 creates the host's segment, with every local rank's inbox. The others
// map it in attach, once it exists.
func newShmTransport(me int, peers []shmPeer, ringCap, maxPayload int, spin time.Duration, yield bool, sig *signals, pool *bufPool, lost func(int, string) error) (*shmTransport, error) {
	t := &shmTransport{me: me, peers: peers, name: peers[0].seg, ringCap: ringCap, maxP: maxPayload, spin: spin, yield: yield, sig: sig, pool: pool, lost: lost}
	t.pidfds = make([]int, len(peers))
	for i := range t.pidfds {
		t.pidfds[i] = -1
	}
	if me == 0 {
		mem, err := createHostSegment(t.name, peers, ringCap)
		if err != nil {
			return nil, err
		}
		t.setMem(mem)
	}
	sig.addWaker(t.interrupt)
	return t, nil
}

// setMem takes the host segment's mapping and cuts it into the inboxes.
func (t *shmTransport) setMem(mem []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.mem = mem
	inbox := int(shmSegmentBytes(len(t.peers), t.ringCap))
	t.segs = make([]*shmSegment, len(t.peers))
	for i := range t.segs {
		t.segs[i] = &shmSegment{mem: mem[i*inbox : (i+1)*inbox : (i+1)*inbox]}
	}
	t.board = &board{mem: mem[len(t.peers)*inbox:], n: len(t.peers)}
}

// attach maps the host's segment (local rank 0 has it already) and makes the links.
func (t *shmTransport) attach() error {
	if t.mem == nil {
		mem, err := openHostSegment(t.name, len(t.peers), t.ringCap)
		if err != nil {
			return err
		}
		t.setMem(mem)
	}
	t.links = make([]*shmLink, len(t.peers))
	for i, p := range t.peers {
		if i == t.me {
			continue
		}
		if p.pid == os.Getpid() {
			t.gosched = true
		}
		l := &shmLink{t: t, peer: i}
		l.tx.head, l.tx.data = t.segs[i].ringOf(t.me, len(t.peers), t.ringCap)
		l.rx.head, l.rx.data = t.segs[t.me].ringOf(i, len(t.peers), t.ringCap)
		l.tx.key, l.rx.key = t.segs[i].key(), t.segs[t.me].key()
		l.tx.liveWord, l.rx.liveWord = t.segs[i].live(t.me), t.segs[t.me].live(i)
		t.links[i] = l
	}
	return nil
}

// peerExited reports whether local peer i's process has ended. The pidfd it
// polls is opened the first time a wait sleeps on that peer, so that a rank
// holds descriptors only of the peers it waited for; a process that is gone by
// then (pidfd_open fails with ESRCH) has ended too. A peer in this process, or
// one whose pidfd cannot be had, is watched by its closed word and the
// bootstrap alone.
func (t *shmTransport) peerExited(i int) bool {
	if t.pidfds[i] == -1 {
		t.pidfds[i] = -2
		if p := t.peers[i]; p.pid > 0 && p.pid != os.Getpid() {
			fd, err := unix.PidfdOpen(p.pid, 0)
			if err == unix.ESRCH {
				return true
			}
			if err == nil {
				t.pidfds[i] = fd
			}
		}
	}
	fd := t.pidfds[i]
	if fd < 0 {
		return false
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, _ := unix.Poll(fds, 0)
	return n > 0
}

// unlinkOwn removes the host segment's name (local rank 0 made it) once every
// local rank has mapped it: the memory lives on while mapped, and nothing is
// left in /dev/shm if a rank dies.
func (t *shmTransport) unlinkOwn() {
	if t.me == 0 {
		unix.Unlink(shmDir + t.name)
	}
}

func (t *shmTransport) link(local int) link { return t.links[local] }

// interrupt wakes this rank's own sleeps so that they look at the signals again.
func (t *shmTransport) interrupt() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.mem == nil {
		return
	}
	s := t.segs[t.me]
	atomic.AddUint32(s.doorbell(), 1)
	futex.Wake(s.doorbell(), 1<<30)
	t.wakeBoard()
}

func (t *shmTransport) close(note []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.closed = true
	if t.mem != nil {
		own := t.segs[t.me]
		n := copy(own.mem[offNote+4:offLive], fitNote(note, offLive-offNote-4))
		binary.LittleEndian.PutUint32(own.mem[offNote:], uint32(n))
		atomic.StoreUint32(own.closed(), 1)
		// Wake the peers so that a peer waiting on this rank notices.
		for i, s := range t.segs {
			if i != t.me {
				atomic.AddUint32(s.doorbell(), 1)
				futex.Wake(s.doorbell(), 1<<30)
			}
		}
		t.wakeBoard()
	}
	t.unlinkOwn()
	if t.mem != nil {
		unix.Munmap(t.mem)
		t.mem = nil
		t.segs = nil
		t.board = nil
	}
	for i, fd := range t.pidfds {
		if fd >= 0 {
			unix.Close(fd)
			t.pidfds[i] = -2
		}
	}
	for _, l := range t.links {
		if l != nil {
			for _, f := range l.overflow[l.ovHead:] {
				t.pool.put(f.own)
			}
			l.overflow = nil
		}
	}
}

// ringSide is one end of a ring: pos is this side's position, other (producer
// only) a cached copy of the consumer's.
type ringSide struct {
	head  *uint64
	data  []byte
	pos   uint64
	other uint64
	key   uint64 // the inbox's mark key
	// liveWord is the slot's live word in the inbox's control block; live
	// caches that it is set (the producer set it, the consumer saw it).
	liveWord *uint32
	live     bool
	// faulted is how many bytes from the ring's start this process has mapped
	// ahead of use (prefault); the ring's size once all are.
	faulted int
}

func (r *ringSide) mark(off int) *uint64 { return (*uint64)(unsafe.Pointer(&r.data[off])) }

// prefaultChunk is how much of a ring prefault maps at a time, and
// prefaultFrom where in a ring it starts: the first chunk faults page by page,
// so that a ring that carries a few small frames (the Barriers among hundreds
// of ranks, whose small AllReduce runs on the board) keeps a page or two.
const (
	prefaultChunk = 16 << 10
	prefaultFrom  = prefaultChunk
)

// prefault maps the ring's pages up to end (rounded up to whole chunks of
// prefaultChunk) into this process, in one madvise(MADV_POPULATE_WRITE) per
// chunk, during the ring's first pass. Without it every page of the first pass
// was a page fault in both processes, and a rank faulting on a page its peer
// was faulting on too waited for it, asleep, in the kernel: with other work on
// the cores, a peer preempted in its fault held the rank for a time slice, and
// the first 16,000 small calls on a link ran 100 times slower than the rest
// (docs/collectives.md, "Waiting"). The writer maps a chunk ahead of its
// frames, so the reader, which never passes the writer, maps pages that
// exist; and a ring that is never used stays untouched, one that carries a
// few small frames nearly so (prefaultFrom). On a kernel without
// MADV_POPULATE_WRITE (before Linux 5.14) the pages fault one by one, as
// before.
func (r *ringSide) prefault(end int) {
	for r.faulted < end && r.faulted < len(r.data) {
		from, to := r.faulted, min(r.faulted+prefaultChunk, len(r.data))
		r.faulted = to
		start := uintptr(unsafe.Pointer(&r.data[from])) &^ (shmPage - 1)
		stop := (uintptr(unsafe.Pointer(&r.data[to-1])) + shmPage) &^ (shmPage - 1)
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, start, stop-start, unix.MADV_POPULATE_WRITE); e != 0 {
			r.faulted = len(r.data) // not on this kernel: fault page by page
		}
	}
}

type shmLink struct {
	t    *shmTransport
	peer int // local index
	tx   ringSide
	rx   ringSide

	// sending
	skip int // bytes to the end of the ring, when the reserved frame wraps
	span int // bytes of the reserved frame

	// receiving
	held     int // 0: nothing, 1: a ring frame, 2: an overflow frame
	heldSpan int
	overflow []qframe // frames drained from the ring while the owner waited
	ovHead   int
}

func (l *shmLink) maxPayload() int { return l.t.maxP }

func (l *shmLink) reserve(ctx context.Context, n int) ([]byte, error) {
	if n > l.t.maxP {
		return nil, fmt.Errorf("collective: frame of %d bytes over the limit of %d", n, l.t.maxP)
	}
	c := uint64(l.t.ringCap)
	span := align64(prefixSize + n)
	off := int(l.tx.pos % c)
	skip := 0
	if off+span > int(c) {
		skip = int(c) - off
	}
	need := uint64(skip + span)
	if end := off + skip + span; l.tx.faulted < int(c) && end >= prefaultFrom {
		l.tx.prefault(end + prefaultChunk)
	}
	if c-(l.tx.pos-l.tx.other) < need && !l.room(need) {
		if err := l.t.wait(ctx, l, need); err != nil {
			return nil, err
		}
	}
	l.skip, l.span = skip, span
	start := (off + skip) % int(c)
	return l.tx.data[start+prefixSize : start+prefixSize+n : start+prefixSize+n], nil
}

func (l *shmLink) commit(_ context.Context, h header) error {
	c := uint64(l.t.ringCap)
	pos := l.tx.pos
	if !l.tx.live {
		// The first frame on this ring: the owner's waits look at it from now on.
		atomic.StoreUint32(l.tx.liveWord, 1)
		l.tx.live = true
	}
	if l.skip > 0 {
		off := int(pos % c)
		w := header{kind: kindWrap}
		w.encode(l.tx.data[off+markSize:])
		atomic.StoreUint64(l.tx.mark(off), (pos+1)^l.tx.key)
		pos += uint64(l.skip)
	}
	off := int(pos % c)
	h.encode(l.tx.data[off+markSize:])
	// The mark goes last: it publishes the frame (a full barrier, which also
	// orders it before the load of the peer's sleeping word in wake).
	atomic.StoreUint64(l.tx.mark(off), (pos+1)^l.tx.key)
	l.tx.pos = pos + uint64(l.span)
	l.t.segs[l.peer].wake()
	return nil
}

// available reports whether a frame (or wrap marker) waits in the ring.
func (l *shmLink) available() bool {
	if !l.rx.live {
		if atomic.LoadUint32(l.rx.liveWord) == 0 {
			return false // nothing was ever sent: leave the ring's pages alone
		}
		l.rx.live = true
	}
	off := int(l.rx.pos % uint64(l.t.ringCap))
	if l.rx.faulted <= off && off >= prefaultFrom {
		l.rx.prefault(off + markSize)
	}
	return atomic.LoadUint64(l.rx.mark(off)) == (l.rx.pos+1)^l.rx.key
}

// peekRing decodes the frame at the head of the ring, skipping wrap markers. It
// must only be called when available.
func (l *shmLink) peekRing() (header, []byte, error) {
	c := l.t.ringCap
	var h header
	for {
		off := int(l.rx.pos % uint64(c))
		h.decode(l.rx.data[off+markSize:])
		if h.kind == kindWrap {
			l.rx.pos += uint64(c - off)
			if !l.available() {
				return h, nil, errNoFrame
			}
			continue
		}
		end := off + prefixSize + int(h.n)
		if end > c || int(h.n) > l.t.maxP {
			return h, nil, fmt.Errorf("collective: corrupt frame from local rank %d: %d bytes at ring offset %d", l.t.peers[l.peer].rank, h.n, off)
		}
		if l.rx.faulted < end && end > prefaultFrom {
			l.rx.prefault(end)
		}
		l.heldSpan = align64(prefixSize + int(h.n))
		return h, l.rx.data[off+prefixSize : end : end], nil
	}
}

var errNoFrame = errors.New("collective: no frame")

func (l *shmLink) next(ctx context.Context) (header, []byte, error) {
	for {
		if l.ovHead < len(l.overflow) {
			f := l.overflow[l.ovHead]
			l.held = 2
			return f.h, f.buf, nil
		}
		if l.available() {
			h, p, err := l.peekRing()
			if err == errNoFrame {
				continue
			}
			if err != nil {
				return h, nil, err
			}
			l.held = 1
			return h, p, nil
		}
		if err := l.t.wait(ctx, l, 0); err != nil {
			return header{}, nil, err
		}
	}
}

func (l *shmLink) peek() (header, bool) {
	if l.ovHead < len(l.overflow) {
		return l.overflow[l.ovHead].h, true
	}
	for l.available() {
		h, _, err := l.peekRing()
		if err == errNoFrame {
			continue
		}
		return h, err == nil
	}
	return header{}, false
}

// pending reports whether a frame from the peer waits, drained or in the ring.
func (l *shmLink) pending() bool { return l.ovHead < len(l.overflow) || l.available() }

// room reports whether the ring to the peer has need bytes free.
func (l *shmLink) room(need uint64) bool {
	l.tx.other = atomic.LoadUint64(l.tx.head)
	return uint64(l.t.ringCap)-(l.tx.pos-l.tx.other) >= need
}

// ready is what wait waits for: a frame from the peer (space 0) or space bytes
// free in the ring to the peer.
func (l *shmLink) ready(space uint64) bool {
	if space == 0 {
		return l.pending()
	}
	return l.room(space)
}

func (l *shmLink) release() {
	switch l.held {
	case 1:
		l.rx.pos += uint64(l.heldSpan)
		atomic.StoreUint64(l.rx.head, l.rx.pos)
		l.t.segs[l.peer].wakeForRoom()
	case 2:
		l.t.pool.put(l.overflow[l.ovHead].own)
		l.overflow[l.ovHead] = qframe{}
		l.ovHead++
		if l.ovHead == len(l.overflow) {
			l.overflow = l.overflow[:0]
			l.ovHead = 0
		}
	}
	l.held = 0
}

// drain copies the frames waiting in the rings into the links' overflow queues,
// so that a producer blocked on this rank can go on while this rank itself waits;
// without it two ranks sending each other more than a ring holds would wait for
// each other forever. It runs only on the slow path of a wait. Rings whose head
// frame is held are left alone.
func (t *shmTransport) drain(waiting *shmLink) {
	for _, l := range t.links {
		if l == nil || l == waiting || l.held == 1 || !l.available() {
			continue
		}
		for l.available() {
			h, p, err := l.peekRing()
			if err == errNoFrame {
				break
			}
			if err != nil {
				return
			}
			b := t.pool.get(len(p))
			copy(*b, p)
			l.overflow = append(l.overflow, qframe{h: h, buf: *b, own: b})
			l.rx.pos += uint64(l.heldSpan)
		}
		atomic.StoreUint64(l.rx.head, l.rx.pos)
		t.segs[l.peer].wakeForRoom()
	}
}

// wait returns once l.ready(space) reports true (a frame from the peer for space
// 0, else space bytes free towards it), the signals stop it, or the peer is gone.
// It spins first, then sleeps on this rank's doorbell.
func (t *shmTransport) wait(ctx context.Context, l *shmLink, space uint64) error {
	forData := space == 0
	// Spin (not when the host is oversubscribed), then poll with sched_yield,
	// which lets a peer that shares this CPU run, until t.spin has passed.
	var start time.Time
	pure := t.spin > 0 && !t.yield
	for i := 1; t.spin > 0; i++ {
		if l.ready(space) {
			return nil
		}
		if !pure {
			if t.gosched {
				runtime.Gosched()
			} else {
				unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			}
		}
		if i&255 == 0 || !pure && i&7 == 0 {
			if t.sig.failed.Load() {
				return errStopped
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if start.IsZero() {
				start = time.Now()
				continue
			}
			waited := time.Since(start)
			if waited > t.spin {
				break
			}
			if pure && waited > pureSpin && !boundAlone() {
				pure = false
			}
		}
	}
	for range 64 {
		if l.ready(space) {
			return nil
		}
	}
	own := t.segs[t.me]
	peer := t.segs[l.peer]
	t.sig.arm(ctx)
	for round := 0; ; round++ {
		if l.ready(space) {
			return nil
		}
		if t.sig.failed.Load() {
			return errStopped
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if round > 0 {
			// Slept once already: is the peer still there?
			if atomic.LoadUint32(peer.closed()) != 0 {
				if forData && l.ready(space) {
					return nil
				}
				return t.closedErr(l.peer)
			}
			if t.peerExited(l.peer) {
				return t.lost(t.peers[l.peer].rank, fmt.Sprintf("process %d exited", t.peers[l.peer].pid))
			}
		}
		waiting := l
		if !forData {
			waiting = nil
		}
		t.drain(waiting)
		if err := t.sig.onIdle(); err != nil {
			return err
		}
		if l.ready(space) {
			return nil
		}
		bell := atomic.LoadUint32(own.doorbell())
		sleepFor := uint32(sleepingForData)
		if !forData {
			sleepFor = sleepingForRoom
		}
		atomic.StoreUint32(own.sleeping(), sleepFor)
		if l.ready(space) || t.sig.failed.Load() {
			atomic.StoreUint32(own.sleeping(), sleepingNot)
			continue
		}
		futex.Wait(own.doorbell(), bell, sleepSlice)
		atomic.StoreUint32(own.sleeping(), sleepingNot)
	}
}

// closedErr is the error for a peer that closed the communicator: its note, if
// it failed, else that it closed.
func (t *shmTransport) closedErr(peer int) error {
	mem := t.segs[peer].mem
	n := int(binary.LittleEndian.Uint32(mem[offNote:]))
	if n > 0 && offNote+4+n <= offLive {
		return decodeAbort(mem[offNote+4 : offNote+4+n])
	}
	return t.lost(t.peers[peer].rank, "it closed the communicator")
}

// boundAlone reports whether the calling thread may run on one CPU only (the
// rank was bound to a core) while the ranks do not outnumber the CPUs: then
// the peer it waits for runs on another CPU, and yielding this one cannot let
// the peer run, only other work beside the rank, for the rest of a time slice
// (docs/collectives.md, "Waiting"). A wait then spins for its whole spin period.
func boundAlone() bool {
	var set unix.CPUSet
	return unix.SchedGetaffinity(0, &set) == nil && set.Count() == 1
}

func shmAvailable() bool {
	st, err := os.Stat(shmDir)
	return err == nil && st.IsDir()
}

func (l *shmLink) streams() bool { return true }

// usage returns the size of this rank's inbox and how many of its bytes the
// host holds now (mincore: the pages that frames or the setup touched).
func (t *shmTransport) usage() (size, resident int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.mem == nil {
		return 0, 0
	}
	size, resident = residentBytes(t.segs[t.me].mem)
	if t.me == 0 && resident >= 0 {
		// The board is the host's: local rank 0 counts it.
		bs, br := residentBytes(t.board.mem)
		size += bs
		if br < 0 {
			resident = -1
		} else {
			resident += br
		}
	}
	return size, resident
}

// residentBytes returns len(mem) and how many of its bytes the host holds
// (mincore), -1 if the kernel would not say.
func residentBytes(mem []byte) (size, resident int64) {
	pages := (len(mem) + shmPage - 1) / shmPage
	vec := make([]byte, pages)
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0])))
	if errno != 0 {
		return int64(len(mem)), -1
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return int64(len(mem)), int64(n) * shmPage
}
