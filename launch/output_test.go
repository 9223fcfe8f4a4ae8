package launch

import (
	"bytes"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
)

// chunkReader returns its data in pieces of random size.
type chunkReader struct {
	data []byte
	rng  *rand.Rand
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(c.data), 1+c.rng.IntN(300))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

func TestLinePumpTagsWholeLines(t *testing.T) {
	var in strings.Builder
	for i := range 2000 {
		in.WriteString(strings.Repeat("x", i%250))
		in.WriteString("\n")
	}
	in.WriteString("no newline at the end")
	var out bytes.Buffer
	newLinePump("[3] ", &lineSink{w: &out}).run(&chunkReader{[]byte(in.String()), rand.New(rand.NewPCG(1, 2))})
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2001 {
		t.Fatalf("%d lines, want 2001", len(lines))
	}
	for i, l := range lines[:2000] {
		if l != "[3] "+strings.Repeat("x", i%250) {
			t.Fatalf("line %d = %q", i, l)
		}
	}
	if lines[2000] != "[3] no newline at the end" {
		t.Fatalf("last line %q", lines[2000])
	}
}

func TestLinePumpSplitsOverlongLines(t *testing.T) {
	long := strings.Repeat("y", 3*maxLine+5)
	var out bytes.Buffer
	newLinePump("[0] ", &lineSink{w: &out}).run(strings.NewReader(long + "\nshort\n"))
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 5 || lines[4] != "[0] short" {
		t.Fatalf("%d lines; last %q", len(lines), lines[len(lines)-1])
	}
	total := 0
	for _, l := range lines[:4] {
		if !strings.HasPrefix(l, "[0] ") || len(l) > maxLine+4 {
			t.Fatalf("piece of %d bytes", len(l))
		}
		total += len(l) - 4
	}
	if total != len(long) {
		t.Fatalf("pieces hold %d bytes, want %d", total, len(long))
	}
}

func TestLinePumpUntagged(t *testing.T) {
	var out bytes.Buffer
	newLinePump("", &lineSink{w: &out}).run(strings.NewReader("a\nb"))
	if out.String() != "a\nb\n" {
		t.Fatalf("%q", out.String())
	}
}

type failingWriter struct{ n int }

func (f *failingWriter) Write(p []byte) (int, error) { f.n++; return 0, io.ErrClosedPipe }

func TestLinePumpKeepsDrainingAfterTheSinkFails(t *testing.T) {
	fw := &failingWriter{}
	newLinePump("", &lineSink{w: fw}).run(strings.NewReader(strings.Repeat("line\n", 100000)))
	if fw.n != 1 {
		t.Fatalf("failed sink written %d times, want once", fw.n)
	}
}
