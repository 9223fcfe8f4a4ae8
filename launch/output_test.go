package launch

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/geartest"
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

// A line longer than maxLine comes out whole: one prefix, no newline added
// inside it, whatever the pieces it is read in.
func TestLinePumpKeepsOverlongLinesWhole(t *testing.T) {
	long := strings.Repeat("y", 3*maxLine+5)
	for _, r := range []io.Reader{
		strings.NewReader(long + "\nshort\n" + long),
		&chunkReader{[]byte(long + "\nshort\n" + long), rand.New(rand.NewPCG(3, 4))},
	} {
		var out bytes.Buffer
		newLinePump("[0] ", &lineSink{w: &out}).run(r)
		if want := "[0] " + long + "\n[0] short\n[0] " + long + "\n"; out.String() != want {
			t.Fatalf("%d bytes out, want %d: the long lines are torn or changed", out.Len(), len(want))
		}
	}
}

// While one pump writes a line longer than maxLine, the lines of the others
// wait for its end; they do not land inside it.
func TestLinePumpOverlongLineHoldsOtherPumps(t *testing.T) {
	var out bytes.Buffer
	sink := &lineSink{w: &out, hold: time.Minute}
	long := strings.Repeat("z", 2*maxLine)
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		newLinePump("[0] ", sink).run(pr)
	}()
	pw.Write([]byte(long)) // the first maxLine is out, the line held open
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		newLinePump("[1] ", sink).run(strings.NewReader("other\n"))
	}()
	select {
	case <-wrote:
		t.Fatal("another pump wrote while a long line was open")
	case <-time.After(50 * time.Millisecond):
	}
	pw.Write([]byte("end\n"))
	<-wrote
	pw.Close()
	<-done
	if want := "[0] " + long + "end\n[1] other\n"; out.String() != want {
		t.Fatalf("output of %d bytes, want %d: %q...", out.Len(), len(want), out.String()[:min(out.Len(), 40)])
	}
}

// A pump that begins a long line and stops, or never writes a newline,
// keeps the other pumps and the launcher's own lines waiting at most the
// sink's hold: the line is then cut with a newline and what follows of it is
// a new tagged line.
func TestLinePumpOpenLineHoldIsBounded(t *testing.T) {
	out := &countingWriter{}
	const hold = 100 * time.Millisecond
	sink := &lineSink{w: out, hold: hold}
	long := strings.Repeat("z", maxLine+1)
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		newLinePump("[0] ", sink).run(pr)
	}()
	pw.Write([]byte(long))
	for out.n.Load() < int64(4+len(long)) { // all of it out, the line open
		time.Sleep(time.Millisecond)
	}
	// Unbounded, the others would wait for [0]'s newline, which comes
	// only after them.
	others := make(chan struct{})
	go func() {
		defer close(others)
		newLinePump("[1] ", sink).run(strings.NewReader("other\n"))
		sinkWriter{sink}.Write([]byte("gearrun: note\n"))
	}()
	select {
	case <-others:
	case <-time.After(time.Minute):
		t.Fatal("the others still wait for the open line after a minute")
	}
	pw.Write([]byte("tail\n"))
	pw.Close()
	<-done
	if want := "[0] " + long + "\n[1] other\ngearrun: note\n[0] tail\n"; out.b.String() != want {
		t.Fatalf("output %q...%q, want the open line cut before the others", out.b.String()[:10], out.b.String()[maxLine:])
	}
}

// Pumps fed by one goroutine from one stream (a host's frames) do not wait
// for one another's open line: the rest of that line comes after what is
// being fed, so waiting would only wait out the hold (an hour here; the
// launcher's hosts hung for the job's minute so, when a rank's end came
// while another rank's long line was open). The open line is cut at once.
// Pumps of different feeders still wait
// (TestLinePumpOverlongLineHoldsOtherPumps).
func TestLinePumpSameFeederDoesNotWait(t *testing.T) {
	var out bytes.Buffer
	sink := &lineSink{w: &out, hold: time.Hour}
	host := new(int)
	p0, p1 := newLinePump("[0] ", sink), newLinePump("[1] ", sink)
	p0.feeder, p1.feeder = host, host
	long := strings.Repeat("z", maxLine)
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		p0.feed([]byte(long))
		p0.feed([]byte("zz")) // past maxLine: the line is out and open
		p1.feed([]byte("last 1"))
		p1.end() // a line: it cannot wait for p0's rest, fed below
		p0.feed([]byte("rest\n"))
		p0.end()
	}()
	select {
	case <-fed:
	case <-time.After(time.Minute):
		t.Fatal("a pump waited for the open line of a pump with the same feeder")
	}
	if want := "[0] " + long + "zz\n[1] last 1\n[0] rest\n"; out.String() != want {
		t.Fatalf("output %q...%q, want the open line cut before [1]'s", out.String()[:10], out.String()[maxLine:])
	}
}

// An agent sends a rank's stream end at the start of a line: after another
// rank's open line has ended, never inside it, where the launcher could only
// cut that line to end the stream with its held last bytes.
func TestAgentEndsStreamsBetweenLines(t *testing.T) {
	var buf bytes.Buffer
	out := newFrameWriter(&buf)
	sink := &lineSink{hold: time.Hour}
	p0 := newWholeLinePump(frameStream{out, frameStdout, 0}, sink)
	p1 := newWholeLinePump(frameStream{out, frameStdout, 1}, sink)
	p0.feed([]byte("last 0")) // held: no newline
	p0.end()                  // out: the stream has run dry
	p1.feed([]byte(strings.Repeat("z", maxLine)))
	p1.feed([]byte("zz")) // rank 1's line is out and open
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		endStream(out, frameStdout, 0, p0, true)
	}()
	time.Sleep(20 * time.Millisecond) // give a wrong order its chance
	p1.feed([]byte("rest\n"))
	<-ended
	var order []string
	r := bytes.NewReader(buf.Bytes())
	for {
		kind, rnk, data, err := readFrame(r, nil)
		if err != nil {
			break
		}
		if kind != frameStdout {
			t.Fatalf("frame of kind %q", kind)
		}
		order = append(order, fmt.Sprintf("%d:%q", rnk, data[max(0, len(data)-6):]))
	}
	want := []string{`0:"last 0"`, `1:"zzzzzz"`, `1:"zz"`, `1:"rest\n"`, `0:""`}
	if !slices.Equal(order, want) {
		t.Fatalf("frames (rank: last bytes) %v, want %v", order, want)
	}
}

// countingWriter counts what it was written, for a test to wait on.
type countingWriter struct {
	b bytes.Buffer
	n atomic.Int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	return c.b.Write(p)
}

// Without a prefix the bytes pass through as they come: nothing is added
// (no newline at the end) and no line is split, however long.
func TestLinePumpUntaggedPassesBytesThrough(t *testing.T) {
	long := strings.Repeat("y", 3*maxLine) + "\n" + strings.Repeat("x", 3*maxLine)
	for _, in := range []string{"abc", "a\nb", "a\n\n", long} {
		var out bytes.Buffer
		newLinePump("", &lineSink{w: &out}).run(&chunkReader{[]byte(in), rand.New(rand.NewPCG(5, 6))})
		if out.String() != in {
			t.Fatalf("%d bytes in, %d out: changed", len(in), out.Len())
		}
		// The same fed as RunOnHosts's frames are.
		out.Reset()
		p := newLinePump("", &lineSink{w: &out})
		for i := 0; i < len(in); i += 4096 {
			p.feed([]byte(in[i:min(i+4096, len(in))]))
		}
		p.end()
		if out.String() != in {
			t.Fatalf("fed %d bytes, %d out: changed", len(in), out.Len())
		}
	}
	// Bytes are written as they come, not held for a newline.
	var out bytes.Buffer
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		newLinePump("", &lineSink{w: &out}).run(pr)
	}()
	pw.Write([]byte("prompt: "))
	pw.Close()
	<-done
	if out.String() != "prompt: " {
		t.Fatalf("%q", out.String())
	}
}

// Fed in frames of any size, a tagged pump makes the same lines as it does
// from a reader; end ends the last one, and the pump can be fed again.
func TestLinePumpFeedMakesLines(t *testing.T) {
	long := strings.Repeat("w", maxLine+7)
	in := "a\nbb\n" + long + "\nccc"
	var out bytes.Buffer
	p := newLinePump("[2] ", &lineSink{w: &out})
	rng := rand.New(rand.NewPCG(7, 8))
	for rest := in; len(rest) > 0; {
		n := min(len(rest), 1+rng.IntN(70000))
		p.feed([]byte(rest[:n]))
		rest = rest[n:]
	}
	p.end()
	p.feed([]byte("again"))
	p.end()
	if want := "[2] a\n[2] bb\n[2] " + long + "\n[2] ccc\n[2] again\n"; out.String() != want {
		t.Fatalf("%d bytes out, want %d", out.Len(), len(want))
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

// Through a whole launch, on this machine and on hosts (two ranks on one
// host, whose output shares one connection): untagged, a rank's bytes come
// out unchanged, with no newline added at the end and a 3 MiB line not
// split; tagged, a 3 MiB line is one tagged line, and a last line without a
// newline gets one.
func TestLaunchOutputLongLinesAndLastBytes(t *testing.T) {
	const big = 3 << 20
	ys := strings.Repeat("y", big)
	untagged := `printf abc; head -c ` + strconv.Itoa(big) + ` /dev/zero | tr '\0' y`
	tagged := `head -c ` + strconv.Itoa(big) + ` /dev/zero | tr '\0' y; echo; echo "done $GEAR_RANK"; printf "last $GEAR_RANK"`
	for _, where := range []string{"local", "hosts"} {
		launch := func(t *testing.T, np int, script string, tag bool) string {
			t.Helper()
			var out, errw geartest.Buffer
			opts := Options{Stdout: &out, Stderr: &errw, TagOutput: tag, LineHold: time.Minute, Grace: 2 * time.Second, Timeout: time.Minute, RuntimeDir: t.TempDir()}
			var err error
			if where == "local" {
				_, err = Run(context.Background(), shPlan(t, np, script), opts)
			} else {
				_, err = RunOnHosts(context.Background(), hostsPlan(t, "h1:"+strconv.Itoa(np), np, script), opts, fakeRemote(t))
			}
			if err != nil {
				t.Fatalf("%s: %v\n%s", where, err, errw.String())
			}
			return out.String()
		}
		t.Run(where+"/untagged", func(t *testing.T) {
			if got := launch(t, 1, untagged, false); got != "abc"+ys {
				t.Errorf("%d bytes out, want %d: changed (starts %q, ends %q)", len(got), 3+big, got[:min(len(got), 8)], got[max(len(got)-8, 0):])
			}
		})
		t.Run(where+"/tagged", func(t *testing.T) {
			got := launch(t, 2, tagged, true)
			if !strings.HasSuffix(got, "\n") {
				t.Fatalf("output does not end in a newline: ...%q", got[max(len(got)-20, 0):])
			}
			lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
			for r := range 2 {
				var mine []string
				prefix := "[" + strconv.Itoa(r) + "] "
				for _, l := range lines {
					if strings.HasPrefix(l, prefix) {
						mine = append(mine, l)
					}
				}
				want := []string{prefix + ys, prefix + "done " + strconv.Itoa(r), prefix + "last " + strconv.Itoa(r)}
				if !slices.Equal(mine, want) {
					var lens []int
					for _, l := range lines {
						lens = append(lens, len(l))
					}
					t.Errorf("rank %d: lines of %v bytes; want its 3 MiB line whole and tagged once, then done and last", r, lens)
				}
			}
			if len(lines) != 6 {
				t.Errorf("%d lines, want 6", len(lines))
			}
		})
	}
}
