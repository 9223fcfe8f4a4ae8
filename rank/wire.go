package rank

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The rendezvous protocol. Every message is one frame:
//
//	uint32 big-endian length of what follows | uint8 type | payload
//
// Payload fields are unsigned varints, and byte strings written as a varint length
// followed by the bytes. The exchange on a new connection is:
//
//	coordinator -> rank   hello    magic, 32-byte server nonce   (or refuse "busy")
//	rank -> coordinator   auth     fixed size: 32-byte client nonce, rank (uint32
//	                               big-endian), 32-byte HMAC proof of the token
//	rank -> coordinator   join     the rank's facts (at most maxJoinFrame bytes)
//	coordinator -> rank   welcome  the coordinator's HMAC proof   (or refuse + close)
//	coordinator -> rank   world    the table of all ranks, once every rank joined
//	                               (or fail, naming the ranks that never arrived)
//
// after which the rank sends set, get, wait, barrier and bye, and the coordinator
// answers ok, err, value and barrierDone, and announces lost ranks. The
// coordinator pings every joined rank every heartbeat interval and each rank
// answers; a side that hears nothing from the other for the heartbeat timeout
// takes it for gone, so that a host that vanishes without closing its
// connections (a pulled cable, a dead node) is noticed within seconds.
//
// Neither side allocates more than a small fixed amount for a peer that has not
// proven the token: the coordinator reads the auth frame, whose size is fixed,
// into a buffer of its own before anything else, and a rank reads the hello and
// the welcome with small limits. Every later frame is checked against the
// largest message of its kind (a set's value, the world table).

// Message types.
const (
	msgHello       byte = 1
	msgJoin        byte = 2
	msgWelcome     byte = 3
	msgRefuse      byte = 4
	msgWorld       byte = 5
	msgFail        byte = 6
	msgSet         byte = 7
	msgGet         byte = 8
	msgWait        byte = 9
	msgOK          byte = 10
	msgErr         byte = 11
	msgValue       byte = 12
	msgBarrier     byte = 13
	msgBarrierDone byte = 14
	msgLost        byte = 15
	msgBye         byte = 16
	msgAuth        byte = 17
	msgPing        byte = 18 // heartbeat: the coordinator's, and a rank's answer
)

// wireMagic opens the coordinator's hello; a rank that sees anything else is
// talking to something that is not a gear coordinator.
const wireMagic = "GEARRDZV1"

// Limits that keep a hostile or broken peer from making the other side allocate.
const (
	maxFrame    = 64 << 20 // the world table of rank.MaxWorldSize ranks fits
	maxValue    = 1 << 20
	maxKey      = 1 << 10
	nonceSize   = 32
	proofSize   = 32 // HMAC-SHA256
	maxEndpoint = 64
	// authSize is the auth frame's payload; authFrame its whole frame.
	authSize  = nonceSize + 4 + proofSize
	authFrame = 4 + 1 + authSize
	// maxJoinFrame bounds a join: a rank's facts and its endpoints.
	maxJoinFrame = 64 << 10
	// maxRequestFrame bounds what a joined rank sends: a set of the largest
	// value under the longest key.
	maxRequestFrame = maxValue + maxKey + 64
	// maxHandshakeFrame bounds what a rank reads before the coordinator proved
	// the token: the hello, a refusal, the welcome.
	maxHandshakeFrame = 4 << 10
)

var errFrameTooLarge = errors.New("rank: frame too large")

// worldFrameLimit bounds the world table of size ranks: each rank's entry is
// at most what its join held.
func worldFrameLimit(size int) int {
	return min(maxFrame, 64+size*maxJoinFrame)
}

// busyRefusal is the refusal a coordinator sends instead of its hello when it
// holds as many unproven connections as it takes; a rank dials again.
const busyRefusal = "busy: too many connections are proving the token; try again"

// writeFrame writes one frame. The caller serialises writers.
func writeFrame(w *bufio.Writer, typ byte, payload []byte) error {
	var hdr [5]byte
	binary.BigEndian.PutUint32(hdr[:4], uint32(len(payload)+1))
	hdr[4] = typ
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := w.Write(payload); err != nil {
		return err
	}
	return w.Flush()
}

// readFrameMax reads one frame of at most limit bytes (type and payload); a
// longer one is refused before anything is allocated for it.
func readFrameMax(r io.Reader, buf []byte, limit int) (typ byte, payload []byte, err error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || n > uint32(limit) {
		return 0, nil, fmt.Errorf("%w: %d bytes, over the limit of %d", errFrameTooLarge, n, limit)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return buf[0], buf[1:], nil
}

// enc builds a payload.
type enc struct{ b []byte }

func (e *enc) uint(v uint64)  { e.b = binary.AppendUvarint(e.b, v) }
func (e *enc) int(v int)      { e.uint(uint64(v)) }
func (e *enc) bytes(v []byte) { e.uint(uint64(len(v))); e.b = append(e.b, v...) }
func (e *enc) str(v string)   { e.uint(uint64(len(v))); e.b = append(e.b, v...) }
func (e *enc) raw(v []byte)   { e.b = append(e.b, v...) }
func (e *enc) bool(v bool)    { e.b = append(e.b, boolByte(v)) }
func (e *enc) ints(v []int) {
	e.int(len(v))
	for _, x := range v {
		e.int(x)
	}
}
func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// dec reads a payload; the first error sticks and later reads return zero values.
type dec struct {
	b   []byte
	err error
}

var errShortPayload = errors.New("rank: malformed message")

func (d *dec) fail() {
	if d.err == nil {
		d.err = errShortPayload
	}
}

func (d *dec) uint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

// int reads a non-negative int that must be at most limit.
func (d *dec) int(limit int) int {
	v := d.uint()
	if v > uint64(limit) {
		d.fail()
		return 0
	}
	return int(v)
}

// bytes reads a length-prefixed byte string of at most limit bytes.
func (d *dec) bytes(limit int) []byte { return d.raw(d.int(limit)) }

func (d *dec) str(limit int) string { return string(d.bytes(limit)) }

func (d *dec) raw(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.b) {
		d.fail()
		return nil
	}
	v := append([]byte(nil), d.b[:n]...)
	d.b = d.b[n:]
	return v
}

func (d *dec) bool() bool {
	v := d.raw(1)
	return len(v) == 1 && v[0] != 0
}

func (d *dec) ints(count, limit int) []int {
	n := d.int(count)
	if d.err != nil {
		return nil
	}
	v := make([]int, 0, min(n, len(d.b)))
	for i := 0; i < n && d.err == nil; i++ {
		v = append(v, d.int(limit))
	}
	return v
}

// maxRanks bounds a world's size on the wire.
const maxRanks = MaxWorldSize

// authMsg proves that a rank knows the job token: the first thing a rank
// sends, of a fixed size.
type authMsg struct {
	Nonce [nonceSize]byte
	Rank  uint32
	Proof [proofSize]byte
}

// frame returns the whole auth frame.
func (m *authMsg) frame() []byte {
	b := make([]byte, 0, authFrame)
	b = binary.BigEndian.AppendUint32(b, 1+authSize)
	b = append(b, msgAuth)
	b = append(b, m.Nonce[:]...)
	b = binary.BigEndian.AppendUint32(b, m.Rank)
	return append(b, m.Proof[:]...)
}

// errBadAuth says what was wrong with a connection's first frame.
type errBadAuth struct{ reason string }

func (e *errBadAuth) Error() string { return e.reason }

// readAuth reads the auth frame into a fixed buffer: anything of another size
// or type is refused before any allocation.
func readAuth(r io.Reader) (authMsg, error) {
	var b [authFrame]byte
	if _, err := io.ReadFull(r, b[:4]); err != nil {
		return authMsg{}, err
	}
	if n := binary.BigEndian.Uint32(b[:4]); n != 1+authSize {
		return authMsg{}, &errBadAuth{fmt.Sprintf("first frame announces %d bytes; an auth frame has %d", n, 1+authSize)}
	}
	if _, err := io.ReadFull(r, b[4:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return authMsg{}, err
	}
	return decodeAuth(b[:])
}

// decodeAuth decodes a whole auth frame.
func decodeAuth(b []byte) (authMsg, error) {
	var m authMsg
	if len(b) != authFrame || binary.BigEndian.Uint32(b[:4]) != 1+authSize {
		return m, &errBadAuth{fmt.Sprintf("auth frame of %d bytes, want %d", len(b), authFrame)}
	}
	if b[4] != msgAuth {
		return m, &errBadAuth{fmt.Sprintf("first message is of type %d, not auth", b[4])}
	}
	p := b[5:]
	copy(m.Nonce[:], p[:nonceSize])
	m.Rank = binary.BigEndian.Uint32(p[nonceSize:])
	copy(m.Proof[:], p[nonceSize+4:])
	return m, nil
}

// joinMsg is what a rank says about itself when it joins.
type joinMsg struct {
	JobID string
	Peer  Peer
	Size  int
	// Generation is the world the rank belongs to (GEAR_RESTART_COUNT): the
	// coordinator of a restarted job refuses the stragglers of an older one.
	// It follows the peer; a join without it is of generation 0.
	Generation int
}

func (m *joinMsg) encode() []byte {
	var e enc
	e.str(m.JobID)
	e.int(m.Size)
	encodePeer(&e, &m.Peer)
	e.int(m.Generation)
	return e.b
}

func decodeJoin(p []byte) (joinMsg, error) {
	d := dec{b: p}
	var m joinMsg
	m.JobID = d.str(256)
	m.Size = d.int(maxRanks)
	m.Peer = decodePeer(&d)
	if d.err == nil && len(d.b) > 0 {
		m.Generation = d.int(maxGeneration)
	}
	return m, d.err
}

// maxGeneration bounds a join's generation on the wire.
const maxGeneration = 1 << 30

func encodePeer(e *enc, p *Peer) {
	e.int(p.Rank)
	e.int(p.LocalRank)
	e.int(p.LocalSize)
	e.int(p.Node)
	e.int(p.NumNodes)
	e.str(p.Role)
	e.int(p.RoleRank)
	e.str(p.Host)
	e.int(p.PID)
	e.int(len(p.Endpoints))
	for _, k := range sortedKeys(p.Endpoints) {
		e.str(k)
		e.str(p.Endpoints[k])
	}
}

func decodePeer(d *dec) Peer {
	var p Peer
	p.Rank = d.int(maxRanks)
	p.LocalRank = d.int(maxRanks)
	p.LocalSize = d.int(maxRanks)
	p.Node = d.int(maxRanks)
	p.NumNodes = d.int(maxRanks)
	p.Role = d.str(256)
	p.RoleRank = d.int(maxRanks)
	p.Host = d.str(1024)
	p.PID = d.int(1 << 31)
	n := d.int(maxEndpoint)
	for i := 0; i < n && d.err == nil; i++ {
		if p.Endpoints == nil {
			p.Endpoints = make(map[string]string, n)
		}
		k := d.str(maxKey)
		p.Endpoints[k] = d.str(maxKey * 4)
	}
	return p
}

func encodeWorld(peers []Peer) []byte {
	var e enc
	e.int(len(peers))
	for i := range peers {
		encodePeer(&e, &peers[i])
	}
	return e.b
}

func decodeWorld(p []byte) ([]Peer, error) {
	d := dec{b: p}
	n := d.int(maxRanks)
	peers := make([]Peer, 0, min(n, len(p)))
	for i := 0; i < n && d.err == nil; i++ {
		peers = append(peers, decodePeer(&d))
	}
	if d.err == nil {
		for i := range peers {
			if peers[i].Rank != i {
				return nil, fmt.Errorf("rank: malformed world table: entry %d is rank %d", i, peers[i].Rank)
			}
		}
	}
	return peers, d.err
}
