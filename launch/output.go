package launch

import (
	"bytes"
	"io"
	"sync"
	"time"
)

// maxLine bounds how much of one line a pump that makes lines holds back
// waiting for its newline. A longer line is written whole all the same: its
// first maxLine bytes go out (with the prefix), and the rest follows as it
// comes, without a prefix, while the pump keeps its sink at that line (see
// lineSink.lock).
const maxLine = 1 << 20

// DefaultLineHold is how long a writer waits for a line that another rank
// began and has not ended (a line longer than maxLine) before the sink cuts
// that line, ending it with a newline, and lets the writer go; the rest of
// the cut line goes on as a new tagged line. So a rank that stops in the
// middle of a long line, or never writes a newline, delays the other ranks'
// output by at most this much each time they write.
const DefaultLineHold = time.Second

// A pump's read buffer starts small (most ranks print little, and a launch
// should not fault in 64 KiB per stream) and doubles, up to pumpBuf, while
// reads fill it.
const (
	pumpStart = 4 << 10
	pumpBuf   = 64 << 10
)

// lineSink is one destination stream (the launcher's stdout or stderr, or an
// agent's frames). Writes are made under its lock, so that whole lines of
// different ranks never interleave mid-line; a pump that has begun a line
// longer than maxLine keeps the sink at that line (open) until it ends it or
// another writer has waited hold for it. A failing destination is ignored
// from then on, so that ranks never block on it.
type lineSink struct {
	mu     sync.Mutex
	w      io.Writer
	failed bool
	// hold bounds a writer's wait for another pump's open line; 0 means
	// DefaultLineHold.
	hold time.Duration
	// open is the pump whose line the destination stops in the middle of
	// (nil: at the start of a line); ended is closed when that line ends or
	// is cut.
	open  *linePump
	ended chan struct{}
}

// write writes p whole, at the start of a line: after any pump's open line
// has ended or been cut.
func (s *lineSink) write(p []byte) {
	if len(p) == 0 {
		return
	}
	s.lock(nil)
	s.put(s.w, p)
	s.mu.Unlock()
}

// lock takes s.mu for a write by pump p (nil: a writer that is no pump).
// While another pump's line is open it waits, without the lock, until that
// line ends, and at most s.hold: then it cuts the line (with a newline
// where the pump tags its lines).
func (s *lineSink) lock(p *linePump) {
	s.mu.Lock()
	if s.open == nil || s.open == p {
		return
	}
	hold := s.hold
	if hold <= 0 {
		hold = DefaultLineHold
	}
	t := time.NewTimer(hold)
	defer t.Stop()
	for s.open != nil && s.open != p {
		if p != nil && p.feeder != nil && s.open.feeder == p.feeder {
			// The open line's pump is fed by this goroutine too, from the
			// same stream: its line cannot go on before this write, and
			// waiting would only wait out the hold.
			s.cut()
			return
		}
		ended := s.ended
		s.mu.Unlock()
		select {
		case <-ended:
			s.mu.Lock()
		case <-t.C:
			s.mu.Lock()
			if o := s.open; o != nil && o != p {
				s.cut()
			}
		}
	}
}

// cut ends the open line where it stands, with a newline where its pump
// tags its lines; s.mu is held.
func (s *lineSink) cut() {
	if len(s.open.prefix) > 0 {
		s.put(s.open.dest(), []byte{'\n'})
	}
	s.release()
}

// holds reports whether the sink is at pump p's open line.
func (s *lineSink) holds(p *linePump) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open == p
}

// put writes p to w, the destination or a pump's own writer into it; s.mu is
// held.
func (s *lineSink) put(w io.Writer, p []byte) {
	if !s.failed && len(p) > 0 {
		if _, err := w.Write(p); err != nil {
			s.failed = true
		}
	}
}

// release marks the destination at the start of a line again, ending the
// open line's hold; s.mu is held.
func (s *lineSink) release() {
	if s.open != nil {
		s.open = nil
		close(s.ended)
	}
}

// linePump copies one rank stream to a sink, in one of three ways: as tagged
// lines (newLinePump with a prefix), as the bytes come (newLinePump without
// one), or as whole lines with nothing added (newWholeLinePump).
type linePump struct {
	prefix []byte
	raw    bool // the bytes as they come
	sink   *lineSink
	w      io.Writer // the pump's own writer into the sink; nil: sink.w
	buf    []byte    // read buffer; buf[:held] is an incomplete line
	held   int
	out    []byte
	// open: the pump has written part of a line and not its end, and holds
	// the sink at it (unless the sink cut it since).
	open bool
	// feeder, when set, names the one goroutine that feeds this pump and
	// others with the same feeder, in the order of one stream (RunOnHosts:
	// a host's frames). Such pumps never wait for one another's open line
	// (see lineSink.lock): the stream's sender already ordered their lines.
	feeder any
}

// newLinePump returns a pump to sink. With a prefix it writes whole lines,
// each with the prefix, and ends a last line that lacks a newline with one;
// without one it passes the bytes on as they come, adding nothing.
func newLinePump(prefix string, sink *lineSink) *linePump {
	return &linePump{prefix: []byte(prefix), raw: prefix == "", sink: sink, buf: make([]byte, pumpStart)}
}

// newWholeLinePump returns a pump that writes whole lines to w through
// sink's lock and holds, adding nothing: no prefix, no newline at the end, no
// newline where a hold is cut. An agent sends a rank's output so, each
// pump to its own frames, for a launcher that tags it.
func newWholeLinePump(w io.Writer, sink *lineSink) *linePump {
	return &linePump{sink: sink, w: w, buf: make([]byte, pumpStart)}
}

// dest is where the pump's bytes go.
func (p *linePump) dest() io.Writer {
	if p.w != nil {
		return p.w
	}
	return p.sink.w
}

// run copies r until it ends (EOF, or the read end is closed), then ends the
// stream (end).
func (p *linePump) run(r io.Reader) {
	for {
		p.makeRoom()
		free := len(p.buf) - p.held
		n, err := r.Read(p.buf[p.held:])
		if n > 0 {
			p.took(n)
		}
		if err != nil {
			break
		}
		if n == free && len(p.buf) < pumpBuf {
			p.grow()
		}
	}
	p.end()
}

// feed passes data on as if the pump had read it (RunOnHosts's output
// frames); end ends the stream.
func (p *linePump) feed(data []byte) {
	if p.raw {
		p.sink.lock(p)
		p.sink.put(p.dest(), data)
		p.sink.mu.Unlock()
		return
	}
	for len(data) > 0 {
		p.makeRoom()
		n := copy(p.buf[p.held:], data)
		data = data[n:]
		p.took(n)
		if len(data) > 0 && len(p.buf) < pumpBuf {
			p.grow()
		}
	}
}

// makeRoom makes room in the read buffer when it is full of one line: it
// grows up to maxLine, then the line is written as far as it goes, and held
// open.
func (p *linePump) makeRoom() {
	if p.held < len(p.buf) {
		return
	}
	if len(p.buf) < maxLine {
		p.grow()
		return
	}
	p.emit(p.buf[:p.held], true)
	p.held = 0
}

// grow doubles the read buffer, keeping the held bytes.
func (p *linePump) grow() {
	nb := make([]byte, 2*len(p.buf))
	copy(nb, p.buf[:p.held])
	p.buf = nb
}

// took handles n new bytes after the held ones. A raw pump writes them at
// once. Otherwise complete lines go out in one write and an incomplete tail
// stays, unless it continues the pump's open line, which it extends at once.
func (p *linePump) took(n int) {
	if p.raw {
		p.sink.lock(p)
		p.sink.put(p.dest(), p.buf[p.held:p.held+n])
		p.sink.mu.Unlock()
		return
	}
	data := p.buf[:p.held+n]
	last := bytes.LastIndexByte(data[p.held:], '\n')
	if last < 0 {
		if p.open && p.sink.holds(p) {
			p.emit(data, true)
			p.held = 0
			return
		}
		p.open = false // cut: what follows is held as a new line
		p.held += n
		return
	}
	end := p.held + last + 1
	p.emit(data[:end], false)
	p.held = copy(p.buf, data[end:])
}

// end ends the stream: a held line goes out (a tagged one ended with a
// newline), and a line left open is released, a tagged one ended with a
// newline unless the sink cut it already. The pump may then be fed again.
func (p *linePump) end() {
	switch {
	case p.held > 0:
		last := p.buf[:p.held]
		if len(p.prefix) > 0 {
			last = append(last, '\n')
		}
		p.emit(last, false)
		p.held = 0
	case p.open:
		s := p.sink
		s.lock(p)
		if s.open == p {
			if len(p.prefix) > 0 {
				s.put(p.dest(), []byte{'\n'})
			}
			s.release()
		}
		p.open = false
		s.mu.Unlock()
	}
}

// emit writes lines with the prefix on each: complete lines (ending in '\n'),
// and a last one that lacks its newline, which the pump holds open when open
// is set (else it is the stream's last). The first line goes without the
// prefix where it is the rest of the pump's open line.
func (p *linePump) emit(lines []byte, open bool) {
	s := p.sink
	s.lock(p)
	rest := p.open && s.open == p
	out := lines
	if len(p.prefix) > 0 {
		out = p.out[:0]
		for len(lines) > 0 {
			i := bytes.IndexByte(lines, '\n')
			var line []byte
			if i < 0 {
				line, lines = lines, nil
			} else {
				line, lines = lines[:i+1], lines[i+1:]
			}
			if !rest {
				out = append(out, p.prefix...)
			}
			rest = false
			out = append(out, line...)
		}
		if cap(out) <= 4*maxLine {
			p.out = out[:0]
		} else {
			p.out = nil
		}
	}
	s.put(p.dest(), out)
	switch {
	case open && s.open != p:
		s.open, s.ended = p, make(chan struct{})
	case !open && s.open == p:
		s.release()
	}
	p.open = open
	s.mu.Unlock()
}

// sinkWriter lets a logger write whole records to a sink.
type sinkWriter struct{ s *lineSink }

func (w sinkWriter) Write(p []byte) (int, error) {
	w.s.write(p)
	return len(p), nil
}
