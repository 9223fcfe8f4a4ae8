package collective

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// acceptOne runs the accepting side of a TCP communicator of two ranks (rank 0,
// waiting for rank 1) and returns its address, its nonce and where its
// connect's error arrives.
func acceptOne(t *testing.T, tuning Tuning) (addr string, nonce []byte, errc chan error) {
	t.Helper()
	tt, err := listenTCP("world", 0, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	errc = make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		err := tt.connect(ctx, []tcpPeer{{rank: 1}}, tuning, newSignals(), &bufPool{}, lostForTest, func(error) {})
		if err == nil {
			tt.close(nil)
		}
		errc <- err
	}()
	return tt.addr(), tt.nonce[:], errc
}

func lostForTest(rank int, reason string) error {
	return &LostError{Rank: rank, WorldRank: rank, Reason: reason}
}

func greeting(magic string, nonce []byte, rank int, id string) []byte {
	b := append([]byte(magic), nonce...)
	b = binary.LittleEndian.AppendUint32(b, uint32(rank))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(id)))
	return append(b, id...)
}

// TestGreetingRefused: a greeting that does not match fails the accepting
// rank's communicator with an error that names the peer's address and what
// did not match, and the peer is told why.
func TestGreetingRefused(t *testing.T) {
	other := make([]byte, 16)
	for _, tc := range []struct {
		name  string
		hello func(nonce []byte) []byte
		want  string
	}{
		{"magic", func([]byte) []byte { return []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n") }, `starts with "GET / HT", want "gearcol1": not a gear collective peer`},
		{"nonce", func([]byte) []byte { return greeting(tcpMagic, other, 1, "world") }, "rank 1 brings the nonce of another listener"},
		{"communicator", func(n []byte) []byte { return greeting(tcpMagic, n, 1, "world.split.3") }, `rank 1 is building communicator "world.split.3", this rank "world"`},
		{"rank", func(n []byte) []byte { return greeting(tcpMagic, n, 5, "world") }, "it says it is rank 5, but this rank waits for ranks [1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, nonce, errc := acceptOne(t, DefaultTuning())
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write(tc.hello(nonce)); err != nil {
				t.Fatal(err)
			}
			err = <-errc
			if err == nil {
				t.Fatal("the communicator accepted a bad greeting")
			}
			for _, want := range []string{`rank 0 of communicator "world": greeting from ` + c.LocalAddr().String(), tc.want} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			// The peer reads why.
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			ans, _ := io.ReadAll(c)
			if len(ans) < 3 || ans[0] != greetRefused || !strings.Contains(string(ans[3:]), tc.want) {
				t.Errorf("the peer read %q, want a refusal saying %q", ans, tc.want)
			}
		})
	}
}

// TestGreetingTimeout: a peer that connects and says nothing fails the
// communicator after Tuning.GreetTimeout, named.
func TestGreetingTimeout(t *testing.T) {
	tuning := DefaultTuning()
	tuning.GreetTimeout = 100 * time.Millisecond
	addr, _, errc := acceptOne(t, tuning)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte(tcpMagic[:4]))
	err = <-errc
	if err == nil || !strings.Contains(err.Error(), "greeting from "+c.LocalAddr().String()+": 4 of 30 bytes within 100ms (Tuning.GreetTimeout)") {
		t.Fatalf("got %v, want the silent peer named", err)
	}
}

// TestGreetingBothSides: two ranks building different communicators at each
// other's addresses both fail, each naming the other.
func TestGreetingBothSides(t *testing.T) {
	addr, nonce, errc := acceptOne(t, DefaultTuning())
	dialer, err := listenTCP("world.split.1", 1, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	derr := dialer.connect(ctx, []tcpPeer{{rank: 0, addr: addr, nonce: nonce}}, DefaultTuning(), newSignals(), &bufPool{}, lostForTest, func(error) {})
	aerr := <-errc
	if aerr == nil || !strings.Contains(aerr.Error(), `rank 1 is building communicator "world.split.1", this rank "world"`) {
		t.Errorf("accepting rank: %v", aerr)
	}
	if derr == nil || !strings.Contains(derr.Error(), "collective: rank 1: rank 0 at "+addr+" refused this rank's greeting: ") ||
		!strings.Contains(derr.Error(), `"world.split.1"`) {
		t.Errorf("dialing rank: %v", derr)
	}
	if errors.Is(derr, context.DeadlineExceeded) {
		t.Errorf("dialing rank waited for its deadline: %v", derr)
	}
}

func TestTuningTimeouts(t *testing.T) {
	tu := DefaultTuning()
	if tu.greetTimeout() != 10*time.Second || tu.byeTimeout() != time.Second {
		t.Fatalf("defaults: greet %v, bye %v", tu.greetTimeout(), tu.byeTimeout())
	}
	tu.GreetTimeout, tu.ByeTimeout = 0, 0
	if tu.greetTimeout() != 10*time.Second || tu.byeTimeout() != time.Second {
		t.Fatalf("zero: greet %v, bye %v", tu.greetTimeout(), tu.byeTimeout())
	}
	tu.GreetTimeout = -time.Second
	if err := tu.validate(); err == nil || !strings.Contains(err.Error(), "Tuning.GreetTimeout -1s") {
		t.Fatalf("negative GreetTimeout: %v", err)
	}
}
