// Package tomlerr words go-toml's decode errors for the files gear reads (job
// specs, topology files): the key as a path with the index of every array
// table it lies in ("gpu[1].instances[0].gi"), and a type mismatch as what
// was wanted and what was found, never a Go struct field.
package tomlerr

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// Describe returns where a decode error lies in data and what it says:
// "PATH: want TYPE, got TOML KIND" for a value of the wrong type, "PATH: MSG"
// for another (an integer out of range), MSG alone where the error names no
// key.
func Describe(de *toml.DecodeError, data []byte) (line, col int, text string) {
	line, col = de.Position()
	msg := strings.TrimPrefix(de.Error(), "toml: ")
	if m := mismatch.FindStringSubmatch(msg); m != nil {
		msg = fmt.Sprintf("want %s, got TOML %s", m[2], m[1])
	}
	if key := Path(data, de.Key(), line); key != "" {
		msg = key + ": " + msg
	}
	return line, col, msg
}

var mismatch = regexp.MustCompile(`^cannot decode TOML (.+?) into (?:.* of type )?(\S+)$`)

// Path writes key, found at line of data, as a field path with the index of
// each array table it lies in: a key on a line under the second [[group]]
// header is "group[1].KEY"; one under the first [[gpu.instances]] after the
// second [[gpu]] is "gpu[1].instances[0].KEY". Headers are matched as
// written, without quoted parts; keys in inline arrays keep no index.
func Path(data []byte, key toml.Key, line int) string {
	counts := map[string]int{} // array table -> its elements so far, within the current element of its parent
	lines := strings.Split(string(data), "\n")
	for _, l := range lines[:min(max(line-1, 0), len(lines))] {
		l, _, _ = strings.Cut(l, "#")
		h := strings.ReplaceAll(strings.ReplaceAll(l, " ", ""), "\t", "")
		if !strings.HasPrefix(h, "[[") || !strings.HasSuffix(h, "]]") {
			continue
		}
		name := h[2 : len(h)-2]
		counts[name]++
		for k := range counts {
			if strings.HasPrefix(k, name+".") {
				delete(counts, k) // a new element: its own arrays start again
			}
		}
	}
	var b strings.Builder
	for i, part := range key {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(Part(part))
		if n := counts[strings.Join(key[:i+1], ".")]; n > 0 && i < len(key)-1 {
			fmt.Fprintf(&b, "[%d]", n-1)
		}
	}
	return b.String()
}

// Part writes one part of a key: bare if it can be, quoted otherwise.
func Part(p string) string {
	if p == "" {
		return `""`
	}
	for _, r := range p {
		if !(r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return fmt.Sprintf("%q", p)
		}
	}
	return p
}
