package launch

import (
	"bytes"
	"io"
	"sync"
)

// maxLine bounds how much of one line is held back waiting for its newline; a
// longer line is written in pieces of this size, each tagged and ended.
const maxLine = 1 << 20

// A pump's read buffer starts small (most ranks print little, and a launch
// should not fault in 64 KiB per stream) and doubles, up to pumpBuf, while
// reads fill it.
const (
	pumpStart = 4 << 10
	pumpBuf   = 64 << 10
)

// lineSink is one destination stream (the launcher's stdout or stderr). Whole
// lines are written under its lock, so lines of different ranks never interleave
// mid-line. A failing destination is ignored from then on, so that ranks never
// block on it.
type lineSink struct {
	mu     sync.Mutex
	w      io.Writer
	failed bool
}

func (s *lineSink) write(p []byte) {
	if len(p) == 0 {
		return
	}
	s.mu.Lock()
	if !s.failed {
		if _, err := s.w.Write(p); err != nil {
			s.failed = true
		}
	}
	s.mu.Unlock()
}

// linePump copies one rank stream to a sink, line by line, with a prefix.
type linePump struct {
	prefix []byte
	sink   *lineSink
	buf    []byte // read buffer; buf[:held] is an incomplete line
	held   int
	out    []byte
}

func newLinePump(prefix string, sink *lineSink) *linePump {
	return &linePump{prefix: []byte(prefix), sink: sink, buf: make([]byte, pumpStart)}
}

// run copies r until it ends (EOF, or the read end is closed).
func (p *linePump) run(r io.Reader) {
	for {
		if p.held == len(p.buf) {
			if len(p.buf) < maxLine {
				p.grow()
			} else {
				p.emit(p.buf[:p.held], true)
				p.held = 0
			}
		}
		free := len(p.buf) - p.held
		n, err := r.Read(p.buf[p.held:])
		if n > 0 {
			p.consume(n)
		}
		if err != nil {
			break
		}
		if n == free && len(p.buf) < pumpBuf {
			p.grow()
		}
	}
	if p.held > 0 {
		p.emit(p.buf[:p.held], true)
		p.held = 0
	}
}

// grow doubles the read buffer, keeping the held bytes.
func (p *linePump) grow() {
	nb := make([]byte, 2*len(p.buf))
	copy(nb, p.buf[:p.held])
	p.buf = nb
}

// consume handles n new bytes after the held ones: complete lines go out in one
// write, the incomplete tail stays.
func (p *linePump) consume(n int) {
	data := p.buf[:p.held+n]
	last := bytes.LastIndexByte(data[p.held:], '\n')
	if last < 0 {
		p.held += n
		return
	}
	end := p.held + last + 1
	p.emit(data[:end], false)
	rest := copy(p.buf, data[end:])
	p.held = rest
}

// emit writes complete lines (ending in '\n', or one unterminated piece when
// addNewline) with the prefix on each.
func (p *linePump) emit(lines []byte, addNewline bool) {
	if len(p.prefix) == 0 && !addNewline {
		p.sink.write(lines)
		return
	}
	out := p.out[:0]
	for len(lines) > 0 {
		i := bytes.IndexByte(lines, '\n')
		var line []byte
		if i < 0 {
			line, lines = lines, nil
		} else {
			line, lines = lines[:i+1], lines[i+1:]
		}
		out = append(out, p.prefix...)
		out = append(out, line...)
		if line[len(line)-1] != '\n' {
			out = append(out, '\n')
		}
	}
	p.sink.write(out)
	if cap(out) <= 4*maxLine {
		p.out = out[:0]
	} else {
		p.out = nil
	}
}

// sinkWriter lets a logger write whole records to a sink.
type sinkWriter struct{ s *lineSink }

func (w sinkWriter) Write(p []byte) (int, error) {
	w.s.write(p)
	return len(p), nil
}
