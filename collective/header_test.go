package collective

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// FuzzDecodeHeader feeds arbitrary frames, as a peer's TCP connection or
// shared-memory ring could hold them, to the header decoder and what the
// receiver does with a header: decoding never fails and round-trips, naming the
// call never panics, a frame is accepted for the call in progress only when it
// matches it field for field, and a goodbye's failure notice decodes to an error.
func FuzzDecodeHeader(f *testing.F) {
	seeds := []header{
		{seq: 7, count: 100, kind: kindAllReduce, dtype: Float32, op: Sum, algo: algoRing, n: 400, step: 3},
		{seq: 1, count: 4, kind: kindBroadcast, dtype: Bytes, algo: algoTree, root: 2, n: 4},
		{seq: 9, count: 16, kind: kindReduceScatter, dtype: Int64, op: Max, algo: algoRing, n: 32, step: 1},
		{seq: 1<<63 + 5, count: 8, kind: kindP2P, dtype: Float64, n: 64},
		{seq: 3, kind: kindBarrier, dtype: Bytes, algo: algoDissemination},
		{kind: kindBye, n: 2},
		{kind: kindWrap},
		{seq: ^uint64(0), count: ^uint64(0), kind: 0xff, dtype: 0xff, op: 0xff, algo: 0xff, root: ^uint32(0), n: ^uint32(0), step: ^uint32(0)},
	}
	for _, h := range seeds {
		b := make([]byte, headerSize)
		h.encode(b)
		f.Add(b)
	}
	bye := make([]byte, headerSize)
	(&header{kind: kindBye}).encode(bye)
	for _, note := range [][]byte{
		encodeAbort(1, &MismatchError{Rank: 1, Call: "AllReduce", PeerRank: 2, PeerCall: "Barrier"}),
		encodeAbort(0, &LostError{Rank: 3, WorldRank: 5, Reason: "killed"}),
		encodeAbort(0, &LostError{Rank: 3, WorldRank: 5, Reason: "killed", Host: "n2"}),
		[]byte("{"),
	} {
		f.Add(append(bytes.Clone(bye), note...))
	}
	f.Add([]byte{})

	// The call in progress that received frames are checked against.
	want := header{seq: 7, count: 100, kind: kindAllReduce, dtype: Float32, op: Sum, algo: algoRing}
	x := &call{c: &Comm{rank: 0}, h: want}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < headerSize {
			return // the transports read whole headers before they decode one
		}
		var h header
		h.decode(b)
		again := make([]byte, headerSize)
		h.encode(again)
		if !bytes.Equal(again, b[:headerSize]) {
			t.Fatalf("header %+v encodes to %x, decoded from %x", h, again, b[:headerSize])
		}
		if h.describe() == "" {
			t.Fatalf("header %+v describes as nothing", h)
		}
		err := x.check(1, &h, h.step, int(h.n))
		match := h.sameCall(&want) && h.algo == want.algo
		var me *MismatchError
		switch {
		case match && err != nil:
			t.Fatalf("frame %+v of the call in progress refused: %v", h, err)
		case !match && !errors.As(err, &me):
			t.Fatalf("frame %+v of another call: got %v, want a *MismatchError", h, err)
		case err != nil && err.Error() == "":
			t.Fatal("empty mismatch error")
		}
		if h.kind == kindBye {
			if err := decodeAbort(b[headerSize:]); err == nil || err.Error() == "" {
				t.Fatalf("failure notice %q decodes to %v", b[headerSize:], err)
			}
		}
	})
}

// TestLostErrorNamesHost checks that a rank lost from a communicator that spans
// several hosts is named with its host, and only then.
func TestLostErrorNamesHost(t *testing.T) {
	c := &Comm{world: []int{0, 1, 2, 3}, hostOf: []int{0, 0, 1, 1}, hosts: [][]int{{0, 1}, {2, 3}}, hostNames: []string{"n1", "n2"}}
	if got, want := c.lostError(3, "connection closed without a goodbye").Error(), "collective: lost rank 3 on n2: connection closed without a goodbye"; got != want {
		t.Errorf("multi-host: %q, want %q", got, want)
	}
	// The other ranks hear of it through the abort notice, host included.
	sent := c.lostError(3, "killed")
	if got := decodeAbort(encodeAbort(0, sent)); got.Error() != sent.Error() {
		t.Errorf("abort notice of %q reads back as %q", sent, got)
	}
	one := &Comm{world: []int{0, 1}, hostOf: []int{0, 0}, hosts: [][]int{{0, 1}}, hostNames: []string{"n1"}}
	if got, want := one.lostError(1, "killed").Error(), "collective: lost rank 1: killed"; got != want {
		t.Errorf("one host: %q, want %q", got, want)
	}
}

// A failure note too long for an inbox is cut to fit and stays readable.
func TestFitNote(t *testing.T) {
	long := strings.Repeat("rank 7 lost: host n2 unreachable ", 400)
	note := encodeAbort(3, &LostError{Rank: 7, WorldRank: 7, Reason: long, Host: "n2"})
	const limit = 3580
	got := fitNote(note, limit)
	if len(got) == 0 || len(got) > limit {
		t.Fatalf("fitNote: %d bytes, want 1 to %d", len(got), limit)
	}
	var le *LostError
	if err := decodeAbort(got); !errors.As(err, &le) || le.Rank != 7 || le.Host != "n2" || !strings.HasSuffix(le.Reason, "...") {
		t.Fatalf("decoded %v, want the LostError of rank 7 on n2 with its reason cut", err)
	}
	if short := encodeAbort(1, ErrClosed); !bytes.Equal(fitNote(short, limit), short) {
		t.Fatal("fitNote changed a note that fits")
	}
}
