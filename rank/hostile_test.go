package rank

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/geartest"
)

func TestAuthRoundTrip(t *testing.T) {
	m := authMsg{Nonce: newNonce(), Rank: 7}
	copy(m.Proof[:], clientProof("tok", []byte("server"), m.Nonce[:], "job-1", 7))
	f := m.frame()
	if len(f) != authFrame {
		t.Fatalf("auth frame is %d bytes, want %d", len(f), authFrame)
	}
	got, err := readAuth(bytes.NewReader(f))
	if err != nil || got != m {
		t.Fatalf("readAuth = %+v, %v; want %+v", got, err, m)
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"oversized header", []byte{0x00, 0xff, 0xff, 0xff, msgAuth}, "announces 16777215 bytes"},
		{"join first", append(binary.BigEndian.AppendUint32(nil, 1+authSize), append([]byte{msgJoin}, make([]byte, authSize)...)...), "type 2, not auth"},
		{"short", f[:20], "unexpected EOF"},
		{"garbage", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "announces"},
	} {
		_, err := readAuth(bytes.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: readAuth error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// TestCoordinatorSurvivesHostileConnections floods a coordinator of a 2-rank
// world with 1,000 connections that send garbage, announce huge frames, prove
// nothing or idle. None is admitted, the coordinator allocates little for them,
// refuses them at Warn, and the real ranks still assemble.
func TestCoordinatorSurvivesHostileConnections(t *testing.T) {
	var logs geartest.Buffer
	c := newCoord(t, 2, func(cfg *CoordinatorConfig) {
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		cfg.HandshakeTimeout = 300 * time.Millisecond
	})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const n = 1000
	flood := make(chan []error)
	go func() { flood <- geartest.HostileFlood(c.Addr(), n, 200, 10*time.Second) }()
	// The real ranks join during the flood.
	worlds, jerrs := joinAll(t, c, 2, nil)
	for _, err := range <-flood {
		t.Errorf("%v (the coordinator should have dropped it)", err)
	}
	runtime.ReadMemStats(&after)
	if jerrs[0] != nil || jerrs[1] != nil {
		t.Fatalf("ranks did not assemble during the flood: %v, %v", jerrs[0], jerrs[1])
	}
	if err := worlds[0].Set(context.Background(), "k", []byte("v")); err != nil {
		t.Fatalf("set after the flood: %v", err)
	}
	if v, _, err := worlds[1].Get(context.Background(), "k"); err != nil || string(v) != "v" {
		t.Fatalf("get after the flood: %q, %v", v, err)
	}
	// Allocation, not heap size: the old protocol allocated every announced
	// frame (16 GiB for this flood).
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Errorf("the coordinator allocated %d MiB for 1,000 hostile connections", grew>>20)
	}
	c.Close()
	log := logs.String()
	for _, want := range []string{"level=WARN", "refused connection", "remote=127.0.0.1:", "reason="} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, firstLines(log, 20))
		}
	}
	// Every refusal is accounted for: logged on a line of its own, or
	// counted in the next logged line's unlogged_before (a refusal in a later
	// second) or in the count logged at Close.
	logged := strings.Count(log, "msg=\"rank: coordinator: refused connection\"")
	counted := 0
	for _, m := range regexp.MustCompile(`(?:unlogged_before|count)=(\d+)`).FindAllStringSubmatch(log, -1) {
		k, _ := strconv.Atoi(m[1])
		counted += k
	}
	if counted == 0 || logged+counted < n {
		t.Errorf("%d refusals logged and %d counted as not logged, want %d or more with some counted:\n%s", logged, counted, n, firstLines(log, 20))
	}
	if lines := strings.Count(log, "\n"); lines > n/4 {
		t.Errorf("%d log lines for %d refusals: not rate-limited", lines, n)
	}
	c.mu.Lock()
	pending := c.pending
	c.mu.Unlock()
	if pending != 0 {
		t.Errorf("%d connections still count as pending", pending)
	}
}

// TestBusyCoordinatorRankRetries fills the coordinator's pending slots with
// idle connections: the next connection is refused as busy at once, and a rank
// that arrives then dials again until it gets in.
func TestBusyCoordinatorRankRetries(t *testing.T) {
	var logs geartest.Buffer
	c := newCoord(t, 1, func(cfg *CoordinatorConfig) {
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		cfg.HandshakeTimeout = 500 * time.Millisecond
		cfg.MaxPending = 4
	})
	var idle []net.Conn
	for range 4 {
		nc, err := net.Dial("tcp", c.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		idle = append(idle, nc)
	}
	// Wait until the coordinator holds all four.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		p := c.pending
		c.mu.Unlock()
		if p == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("coordinator holds %d pending connections, want 4", p)
		}
	}
	nc, err := net.Dial("tcp", c.Addr())
	if err != nil {
		t.Fatal(err)
	}
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(nc)
	nc.Close()
	if !bytes.Contains(b, []byte(busyRefusal)) {
		t.Fatalf("fifth connection got %q, want the busy refusal", b)
	}
	w, err := Init(context.Background(), WithInfo(testInfo(c, 0, 1, "secret")), WithHostID("h"))
	if err != nil {
		t.Fatalf("rank behind a busy coordinator: %v", err)
	}
	w.Close()
	if !strings.Contains(logs.String(), "too many connections proving the token (4)") {
		t.Errorf("busy refusal not logged:\n%s", logs.String())
	}
	_ = idle
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// FuzzAuth feeds arbitrary bytes to the reader of a connection's first frame:
// it fails cleanly or decodes a frame that encodes back to the same bytes.
func FuzzAuth(f *testing.F) {
	m := authMsg{Nonce: newNonce(), Rank: 3}
	f.Add(m.frame())
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, msgJoin})
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, p []byte) {
		got, err := readAuth(bytes.NewReader(p))
		if err != nil {
			return
		}
		if !bytes.Equal(got.frame(), p[:authFrame]) {
			t.Fatalf("auth frame %x decodes to %+v, which encodes differently", p[:authFrame], got)
		}
	})
}

// FuzzReadFrame checks that a frame is never larger than the limit it is read
// with, whatever its header says.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{0, 0, 0, 3, msgSet, 'h', 'i'}, uint16(16))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1}, uint16(100))
	f.Fuzz(func(t *testing.T, p []byte, limit uint16) {
		typ, payload, err := readFrameMax(bytes.NewReader(p), nil, int(limit))
		if err == nil && 1+len(payload) > int(limit) {
			t.Fatalf("frame of type %d with %d payload bytes read under a limit of %d", typ, len(payload), limit)
		}
	})
}

// FuzzCoordinatorHandshake sends arbitrary bytes to a live coordinator as a new
// connection: it must answer with its hello and at most a refusal, admit
// nobody, and let the connection go.
func FuzzCoordinatorHandshake(f *testing.F) {
	c, err := NewCoordinator(CoordinatorConfig{JobID: "job-1", Token: "secret", Size: 2,
		HandshakeTimeout: time.Second})
	if err != nil {
		f.Fatal(err)
	}
	defer c.Close()
	m := authMsg{Nonce: newNonce(), Rank: 1}
	join := joinMsg{JobID: "job-1", Size: 2, Peer: Peer{Rank: 1, Host: "h"}}
	f.Add(append(m.frame(), frame(msgJoin, func(e *enc) { e.raw(join.encode()) })...))
	f.Add([]byte{0x00, 0xff, 0xff, 0xff, msgJoin})
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, p []byte) {
		conn := &memConn{in: bytes.NewReader(p), closed: make(chan struct{})}
		c.admit(conn)
		<-conn.closed
		got := conn.written()
		if len(got) < 5 || got[4] != msgHello {
			t.Fatalf("coordinator answered %x, want its hello first", got)
		}
		c.mu.Lock()
		joined := c.joinedN
		c.mu.Unlock()
		if joined != 0 {
			t.Fatalf("input %x joined a rank without the token", p)
		}
	})
}

// memConn is a connection whose peer sent in and then closed its side; what
// the other side writes is kept.
type memConn struct {
	in     *bytes.Reader
	mu     sync.Mutex
	out    []byte
	once   sync.Once
	closed chan struct{}
}

func (m *memConn) Read(b []byte) (int, error) { return m.in.Read(b) }
func (m *memConn) Write(b []byte) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.out = append(m.out, b...)
	return len(b), nil
}
func (m *memConn) written() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]byte(nil), m.out...)
}
func (m *memConn) Close() error                       { m.once.Do(func() { close(m.closed) }); return nil }
func (m *memConn) LocalAddr() net.Addr                { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }
func (m *memConn) RemoteAddr() net.Addr               { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2} }
func (m *memConn) SetDeadline(t time.Time) error      { return nil }
func (m *memConn) SetReadDeadline(t time.Time) error  { return nil }
func (m *memConn) SetWriteDeadline(t time.Time) error { return nil }

// TestRefusalReasons checks that each kind of hostile connection is refused at
// Warn with its peer's address and what was wrong.
func TestRefusalReasons(t *testing.T) {
	for kind, want := range []string{
		`reason="first frame announces 1195725856 bytes; an auth frame has 69"`, // "GET "
		`reason="first frame announces 16777216 bytes; an auth frame has 69"`,
		`reason="the job token proof of a claimed rank 0 does not match`,
		`reason="no auth within the handshake deadline"`,
	} {
		var logs geartest.Buffer
		c := newCoord(t, 2, func(cfg *CoordinatorConfig) {
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			cfg.HandshakeTimeout = 200 * time.Millisecond
		})
		if err := geartest.Hostile(c.Addr(), kind, 5*time.Second); err != nil {
			t.Errorf("kind %d: %v", kind, err)
		}
		c.Close()
		log := logs.String()
		if !strings.Contains(log, "level=WARN") || !strings.Contains(log, "remote=127.0.0.1:") || !strings.Contains(log, want) {
			t.Errorf("kind %d: log lacks %s:\n%s", kind, want, log)
		}
	}
}
