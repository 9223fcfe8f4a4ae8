package collective

import (
	"encoding/binary"
	"fmt"
)

// kind is the operation a frame belongs to.
type kind uint8

const (
	kindAllReduce kind = iota + 1
	kindBroadcast
	kindReduce
	kindAllGather
	kindGather
	kindScatter
	kindReduceScatter
	kindAllToAll
	kindBarrier
	kindSplit // the exchanges inside Split
	kindP2P   // Send/Recv: seq holds the tag
	kindBye   // the peer closed the communicator (TCP)
	kindWrap  // shared-memory ring: skip to the start of the ring
)

func (k kind) String() string {
	switch k {
	case kindAllReduce:
		return "AllReduce"
	case kindBroadcast:
		return "Broadcast"
	case kindReduce:
		return "Reduce"
	case kindAllGather:
		return "AllGather"
	case kindGather:
		return "Gather"
	case kindScatter:
		return "Scatter"
	case kindReduceScatter:
		return "ReduceScatter"
	case kindAllToAll:
		return "AllToAll"
	case kindBarrier:
		return "Barrier"
	case kindSplit:
		return "Split"
	case kindP2P:
		return "Send"
	case kindBye:
		return "Close"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

func (k kind) rooted() bool {
	return k == kindBroadcast || k == kindReduce || k == kindGather || k == kindScatter
}

func (k kind) reduces() bool {
	return k == kindAllReduce || k == kindReduce || k == kindReduceScatter
}

// headerSize is the encoded size of a header: every frame starts with one.
const headerSize = 32

// header describes one frame and the call it belongs to. Every frame carries the
// whole description of its call (sequence number, kind, element type, count, op,
// root, algorithm), so that a receiver can tell a frame of a different call from
// one of its own and name both.
type header struct {
	seq   uint64 // call sequence number on the communicator; the tag for kindP2P
	count uint64 // elements of the call (see callDesc for what each kind counts)
	kind  kind
	dtype DType
	op    Op
	algo  algo   // the algorithm the sender runs
	root  uint32 // root of rooted calls
	n     uint32 // payload bytes of this frame
	step  uint32 // algorithm-defined position of the frame (for protocol checks)
	// p2p names a point-to-point call of this rank in errors ("Recv",
	// "SendRecv"; "" is "Send", as every frame received says): not sent.
	p2p string
}

func (h *header) encode(b []byte) {
	_ = b[headerSize-1]
	binary.LittleEndian.PutUint64(b[0:], h.seq)
	binary.LittleEndian.PutUint64(b[8:], h.count)
	b[16] = byte(h.kind)
	b[17] = byte(h.dtype)
	b[18] = byte(h.op)
	b[19] = byte(h.algo)
	binary.LittleEndian.PutUint32(b[20:], h.root)
	binary.LittleEndian.PutUint32(b[24:], h.n)
	binary.LittleEndian.PutUint32(b[28:], h.step)
}

func (h *header) decode(b []byte) {
	_ = b[headerSize-1]
	h.seq = binary.LittleEndian.Uint64(b[0:])
	h.count = binary.LittleEndian.Uint64(b[8:])
	h.kind = kind(b[16])
	h.dtype = DType(b[17])
	h.op = Op(b[18])
	h.algo = algo(b[19])
	h.root = binary.LittleEndian.Uint32(b[20:])
	h.n = binary.LittleEndian.Uint32(b[24:])
	h.step = binary.LittleEndian.Uint32(b[28:])
}

// sameCall reports whether h belongs to the call described by want.
func (h *header) sameCall(want *header) bool {
	return h.seq == want.seq && h.kind == want.kind && h.dtype == want.dtype &&
		h.count == want.count && h.op == want.op && h.root == want.root
}

// describe names the call a header belongs to, the way errors print it:
// "AllReduce(sum, float32, 100 elements) as call 7".
func (h *header) describe() string {
	switch h.kind {
	case kindP2P:
		name := h.p2p
		if name == "" {
			name = "Send"
		}
		return fmt.Sprintf("%s(%v, %d elements, tag %d)", name, h.dtype, h.count, int64(h.seq))
	case kindBarrier:
		return fmt.Sprintf("Barrier as call %d", h.seq)
	case kindSplit:
		return fmt.Sprintf("Split as call %d", h.seq)
	}
	s := h.kind.String() + "("
	if h.kind.reduces() {
		s += h.op.String() + ", "
	}
	s += fmt.Sprintf("%v, %d elements", h.dtype, h.count)
	if h.kind.rooted() {
		s += fmt.Sprintf(", root %d", int32(h.root)) // a root out of range as the caller gave it (-1, not 4294967295)
	}
	return s + fmt.Sprintf(") as call %d", h.seq)
}
