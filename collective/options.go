package collective

import (
	"fmt"
	"runtime"
	"time"
)

// Transport kinds for WithTransport.
const (
	TransportAuto = ""    // shared memory between ranks of one host, TCP across hosts
	TransportTCP  = "tcp" // TCP between every pair of ranks
	TransportShm  = "shm" // shared memory; every rank must be on one host
)

// Tuning holds the sizes that choose algorithms and shape the pipelines. Every
// rank of a world must use the same Tuning: New checks it. The defaults were
// measured on a 2-core host (docs/collectives.md).
type Tuning struct {
	// ChunkBytes is the payload of one frame: large messages move in chunks of
	// this size, pipelined along the ring or chain.
	ChunkBytes int
	// RingBytes is the capacity of one shared-memory ring (one per ordered pair of
	// ranks on a host). At least 4 chunks.
	RingBytes int
	// InboxBytes caps the rings of one rank's inbox together, so that the
	// shared memory of a host grows with its ranks, not with their pairs:
	// when RingBytes times the other ranks of the largest host is more, a
	// communicator's rings shrink to the largest power of two that fits (16
	// KiB at least), and its chunks to an eighth of a ring (its small-message
	// thresholds with them). Zero: 32 MiB; negative: no cap.
	InboxBytes int
	// SmallAllReduce: an AllReduce of at most this many bytes uses recursive
	// doubling; a larger one the ring (reduce-scatter then allgather). At most
	// ChunkBytes.
	SmallAllReduce int
	// SmallBroadcast: a Broadcast of at most this many bytes, among at least 5
	// ranks, uses a binomial tree; otherwise a pipelined chain. A Reduce
	// switches at the same size.
	SmallBroadcast int
	// StreamBytes: calls moving at least this many bytes (count times element
	// size) may write their shared-memory frames with streaming stores, which
	// bypass the writer's cache, so that the reader on another core reads them
	// from memory rather than from the writer's cache. Whether that pays depends
	// on where the cores are; every rank learns it at run time (stream.go).
	// Negative: never.
	StreamBytes int
	// BoardBytes: an AllReduce of at most this many bytes (at most 64 KiB)
	// among ranks that all share one host's memory runs on the host's board
	// (one step: every rank writes its slot, the last to arrive reduces, the
	// others wait on one word), and so does a Barrier. Negative: the default,
	// 64 KiB when the host's ranks outnumber its CPUs, else 4 KiB from 3 ranks
	// (at 2 ranks recursive doubling is one exchange already). Zero: never.
	BoardBytes int
	// Spin is how long a wait on shared memory polls before it sleeps on a
	// futex. On an oversubscribed machine (more ranks of the world under its
	// kernel than CPUs, counting ranks in its other network namespaces)
	// a wait polls with sched_yield, so that the rank it waits for can have the
	// CPU. Negative: the default, 2ms oversubscribed and 5ms otherwise, and
	// none (a wait sleeps at once) when ranks outnumber CPUs more than eight to
	// one: then the rank waited for is seldom running, and ranks that poll
	// keep it, and the launcher's coordinator, from the CPUs.
	Spin time.Duration
	// GreetTimeout bounds the TCP handshake while a communicator is built: how
	// long a rank waits for a peer that connected to it to greet it, and for
	// the answer to its own greeting. Zero: 10 s.
	GreetTimeout time.Duration
	// ByeTimeout bounds the goodbye that Close writes to every TCP peer (a peer
	// that stopped reading must not hold Close up). Zero: 1 s.
	ByeTimeout time.Duration
}

// DefaultTuning returns the measured defaults.
func DefaultTuning() Tuning {
	return Tuning{
		ChunkBytes:     256 << 10,
		RingBytes:      2 << 20,
		InboxBytes:     defaultInboxBytes,
		SmallAllReduce: 128 << 10,
		SmallBroadcast: 16 << 10,
		StreamBytes:    16 << 10,
		BoardBytes:     -1,
		Spin:           -1,
		GreetTimeout:   10 * time.Second,
		ByeTimeout:     time.Second,
	}
}

func (t Tuning) validate() error {
	switch {
	case t.ChunkBytes < 64 || t.ChunkBytes%64 != 0:
		return fmt.Errorf("collective: Tuning.ChunkBytes %d: want a multiple of 64, at least 64", t.ChunkBytes)
	case t.RingBytes < 4*(t.ChunkBytes+frameAlignment) || t.RingBytes%64 != 0:
		return fmt.Errorf("collective: Tuning.RingBytes %d: want a multiple of 64 holding at least 4 chunks of %d bytes", t.RingBytes, t.ChunkBytes)
	case t.SmallAllReduce < 0 || t.SmallAllReduce > t.ChunkBytes:
		return fmt.Errorf("collective: Tuning.SmallAllReduce %d: want 0 to ChunkBytes (%d)", t.SmallAllReduce, t.ChunkBytes)
	case t.SmallBroadcast < 0 || t.SmallBroadcast > t.ChunkBytes:
		return fmt.Errorf("collective: Tuning.SmallBroadcast %d: want 0 to ChunkBytes (%d)", t.SmallBroadcast, t.ChunkBytes)
	case t.BoardBytes > boardSlot:
		return fmt.Errorf("collective: Tuning.BoardBytes %d: want at most %d", t.BoardBytes, boardSlot)
	case t.GreetTimeout < 0:
		return fmt.Errorf("collective: Tuning.GreetTimeout %v: want a positive duration, or 0 for the default", t.GreetTimeout)
	case t.ByeTimeout < 0:
		return fmt.Errorf("collective: Tuning.ByeTimeout %v: want a positive duration, or 0 for the default", t.ByeTimeout)
	}
	return nil
}

// greetTimeout and byeTimeout resolve GreetTimeout and ByeTimeout.
func (t Tuning) greetTimeout() time.Duration {
	if t.GreetTimeout > 0 {
		return t.GreetTimeout
	}
	return 10 * time.Second
}

func (t Tuning) byeTimeout() time.Duration {
	if t.ByeTimeout > 0 {
		return t.ByeTimeout
	}
	return time.Second
}

// defaultInboxBytes is InboxBytes' default: rings of 2 MiB for up to 17 ranks
// on a host; 128 KiB rings of 16 KiB chunks at 256 ranks, 8 GiB in all.
const defaultInboxBytes = 32 << 20

// minRingBytes is the smallest ring that InboxBytes shrinks rings to.
const minRingBytes = 16 << 10

// shmSizes returns the ring capacity and the chunk (frame payload) of a
// communicator whose largest host has local ranks on shared memory: RingBytes
// and ChunkBytes, unless InboxBytes asks for less (see InboxBytes).
func (t Tuning) shmSizes(local int) (ring, chunk int) {
	ring, chunk = t.RingBytes, t.ChunkBytes
	if local < 2 || t.InboxBytes < 0 {
		return ring, chunk
	}
	budget := int64(t.InboxBytes)
	if budget == 0 {
		budget = defaultInboxBytes
	}
	per := budget / int64(local-1)
	if int64(ring) <= per {
		return ring, chunk
	}
	r := minRingBytes
	for int64(r)*2 <= per {
		r *= 2
	}
	if r >= ring {
		return ring, chunk
	}
	return r, min(chunk, r/8&^63)
}

// boardSlot is a rank's slot on the board: the largest board call.
const boardSlot = 64 << 10

// boardSmall is the default BoardBytes where every rank has a CPU.
const boardSmall = 4 << 10

// boardFor resolves BoardBytes for a communicator of n ranks on one host that
// share cpus CPUs with cpuRanks ranks of the world; every rank of the
// communicator computes the same.
func (t Tuning) boardFor(n, cpuRanks, cpus int) int {
	switch {
	case t.BoardBytes >= 0:
		return t.BoardBytes
	case cpuRanks > cpus:
		return boardSlot
	case n >= 3:
		return boardSmall
	}
	return 0
}

// frameAlignment is the padding a frame header adds in a ring, at most.
const frameAlignment = 64 + headerSize

// spinFor resolves Spin for a machine whose CPUs local ranks share. A futex wakeup took about
// half a millisecond on the 2-core host measured (docs/collectives.md): a spin
// shorter than that let two ranks fall into waking each other up on every
// message, so the default spins well past it.
func (t Tuning) spinFor(local int) time.Duration {
	if t.Spin >= 0 {
		return t.Spin
	}
	if local > 8*runtime.NumCPU() {
		return 0
	}
	if local > runtime.NumCPU() {
		return 2 * time.Millisecond // polling with sched_yield
	}
	return 5 * time.Millisecond
}

// boardSpin is how long a wait on the board polls with sched_yield before it
// sleeps, when ranks outnumber CPUs: longer than a board call takes at 128
// ranks on 2 CPUs. Sleeping lets a CPU fall idle, and a virtual CPU woken from
// idle took about half a millisecond: a board call whose waiters slept took
// ten times as long as one whose waiters yielded (docs/collectives.md).
const boardSpin = 20 * time.Millisecond

// boardSpinFor resolves how long a wait on the board polls: Spin when set,
// else boardSpin when cpuRanks ranks outnumber the cpus, else the default spin.
func (t Tuning) boardSpinFor(cpuRanks, cpus int) time.Duration {
	switch {
	case t.Spin >= 0:
		return t.Spin
	case cpuRanks > cpus:
		return boardSpin
	}
	return t.spinFor(cpuRanks)
}

type config struct {
	name       string
	transport  string
	loopback   *Loopback
	listenHost string
	tuning     Tuning
}

// Option changes how New builds a communicator.
type Option func(*config)

// WithTransport chooses the transport: TransportAuto ("" or "auto"),
// TransportTCP ("tcp") or TransportShm ("shm"), in any case. A launcher passes
// the value of GEAR_TRANSPORT here.
func WithTransport(kind string) Option { return func(c *config) { c.transport = kind } }

// WithLoopback connects the ranks through lb, for worlds whose ranks are goroutines
// of one process. It overrides WithTransport.
func WithLoopback(lb *Loopback) Option { return func(c *config) { c.loopback = lb } }

// WithListenHost sets the address (host name or IP) on which this rank accepts TCP
// connections from its peers; it must be reachable from every other host of the
// world. The default is the Bootstrap's ListenHost, if it has one, else 127.0.0.1.
func WithListenHost(host string) Option { return func(c *config) { c.listenHost = host } }

// WithName names the communicator New builds: every rank must give the same name,
// and two communicators built from one Bootstrap need different names. The
// default is "world".
func WithName(name string) Option { return func(c *config) { c.name = name } }

// WithTuning replaces the default Tuning.
func WithTuning(t Tuning) Option { return func(c *config) { c.tuning = t } }
