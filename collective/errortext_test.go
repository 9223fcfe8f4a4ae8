package collective_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/collective/collectivetest"
)

// TestPointToPointErrorsNameTheirCall: a Recv or a SendRecv that fails says
// so; every point-to-point call said "Send".
func TestPointToPointErrorsNameTheirCall(t *testing.T) {
	cs, _ := collectivetest.Comms(t, 2, collectivetest.Config{Transport: collectivetest.Shm})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := collective.Recv(ctx, cs[0], make([]int32, 3), 1, 4)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "Recv(int32, 3 elements, tag 4)") {
		t.Errorf("Recv past its deadline: %v", err)
	}
	cs2, _ := collectivetest.Comms(t, 2, collectivetest.Config{Transport: collectivetest.Shm})
	err = collective.SendRecv(context.Background(), cs2[0], [][]byte{make([]byte, 8)}, [][]byte{make([]byte, 8)}, 6, 1)
	if err == nil || !strings.Contains(err.Error(), "SendRecv(") {
		t.Errorf("SendRecv with peer 6 of 2: %v", err)
	}
}

// TestRootOutOfRangeIsPrintedAsGiven: a root of -1 is named -1, not as the
// unsigned word of the frame header.
func TestRootOutOfRangeIsPrintedAsGiven(t *testing.T) {
	cs, _ := collectivetest.Comms(t, 2, collectivetest.Config{Transport: collectivetest.Shm})
	err := collective.Broadcast(context.Background(), cs[0], make([]float32, 4), -1)
	if err == nil || !strings.Contains(err.Error(), "root -1") || strings.Contains(err.Error(), "4294967295") {
		t.Errorf("Broadcast from root -1: %v", err)
	}
}

// TestMismatchTextIsTheSameFromBothSides: the two ranks of a mismatch, each
// noticing it from its side, get the same text (the lower rank first).
func TestMismatchTextIsTheSameFromBothSides(t *testing.T) {
	a := &collective.MismatchError{Rank: 0, Call: "AllReduce(sum, float32, 3 elements) as call 1", PeerRank: 1, PeerCall: "AllReduce(sum, float32, 4 elements) as call 1"}
	b := &collective.MismatchError{Rank: 1, Call: a.PeerCall, PeerRank: 0, PeerCall: a.Call}
	if a.Error() != b.Error() {
		t.Fatalf("rank 0 says %q, rank 1 %q", a.Error(), b.Error())
	}
	if !strings.HasPrefix(a.Error(), "collective: mismatched calls: rank 0 called AllReduce(sum, float32, 3 elements)") {
		t.Fatalf("text %q: want rank 0's call first", a.Error())
	}
}

// TestLostRankNamesItsHostFromTheCoordinator: a rank that the coordinator
// reports lost is named with its host, as one the transport finds lost is.
func TestLostRankNamesItsHostFromTheCoordinator(t *testing.T) {
	cs, w := collectivetest.Comms(t, 3, collectivetest.Config{Transport: collectivetest.Auto, Hosts: []string{"a", "a", "b"}})
	time.AfterFunc(100*time.Millisecond, func() { w.Lose(2, "gone") })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	for _, c := range cs[:2] {
		go func() { errs <- collective.AllReduce(ctx, c, make([]float64, 1000), collective.Sum) }()
	}
	for range 2 {
		var le *collective.LostError
		if err := <-errs; !errors.As(err, &le) || le.Rank != 2 || le.Host != "b" {
			t.Errorf("AllReduce beside a lost rank 2 of host b: %v (%+v)", err, le)
		}
	}
}
