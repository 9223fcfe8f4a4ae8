package rank

import (
	"bufio"
	"bytes"
	"reflect"
	"testing"
)

func TestJoinRoundTrip(t *testing.T) {
	m := joinMsg{JobID: "j", Size: 9, Generation: 3,
		Peer: Peer{Rank: 3, LocalRank: 1, LocalSize: 4, Node: 1, NumNodes: 2, Role: "actor",
			RoleRank: 2, Host: "h/1", PID: 42, Endpoints: map[string]string{"tcp": "127.0.0.1:9", "shm": "gear.j.x"}}}
	got, err := decodeJoin(m.encode())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("got %+v\nwant %+v", got, m)
	}
}

// A join without a generation (encoded before restarts existed) is of
// generation 0.
func TestJoinWithoutGeneration(t *testing.T) {
	m := joinMsg{JobID: "j", Size: 2, Peer: Peer{Rank: 1, Host: "h"}}
	var e enc
	e.str(m.JobID)
	e.int(m.Size)
	encodePeer(&e, &m.Peer)
	got, err := decodeJoin(e.b)
	if err != nil || got.Generation != 0 || got.Peer.Rank != 1 {
		t.Fatalf("decodeJoin = %+v, %v; want rank 1 of generation 0", got, err)
	}
}

func TestFrameRoundTrip(t *testing.T) {
	var b bytes.Buffer
	w := bufio.NewWriter(&b)
	if err := writeFrame(w, msgSet, []byte("payload")); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b.Bytes(), frame(msgSet, func(e *enc) { e.raw([]byte("payload")) })) {
		t.Fatal("writeFrame and frame disagree")
	}
	typ, p, err := readFrameMax(bufio.NewReader(&b), nil, maxFrame)
	if err != nil || typ != msgSet || string(p) != "payload" {
		t.Fatalf("readFrame = %d %q %v", typ, p, err)
	}
	huge := []byte{0xff, 0xff, 0xff, 0xff, 1}
	if _, _, err := readFrameMax(bufio.NewReader(bytes.NewReader(huge)), nil, maxFrame); err == nil {
		t.Fatal("oversized frame accepted")
	}
}

// FuzzDecode feeds arbitrary payloads to every decoder: they must fail cleanly,
// never panic or allocate without bound.
func FuzzDecode(f *testing.F) {
	m := joinMsg{JobID: "j", Size: 2, Peer: Peer{Rank: 1, Host: "h"}}
	f.Add(m.encode())
	f.Add(encodeWorld([]Peer{{Rank: 0, Host: "a"}, {Rank: 1, Host: "b", Endpoints: map[string]string{"k": "v"}}}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, p []byte) {
		decodeJoin(p)
		decodeWorld(p)
		d := dec{b: p}
		d.ints(maxRanks, maxRanks)
	})
}
