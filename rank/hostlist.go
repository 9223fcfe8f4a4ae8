package rank

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxHostlistHosts bounds how many host names ParseHostlist expands one list to,
// so that a malformed or hostile list ("n[0-99999999]") is an error, not an
// allocation of gigabytes.
const MaxHostlistHosts = 1 << 16

// ParseHostlist expands a SLURM hostlist, as found in SLURM_JOB_NODELIST, into host
// names in SLURM's order:
//
//	"gpu[01-04,07],cpu1"     -> gpu01 gpu02 gpu03 gpu04 gpu07 cpu1
//	"rack[1-2]-node[01-02]"  -> rack1-node01 rack1-node02 rack2-node01 rack2-node02
//
// Items are separated by commas outside brackets. A bracket group holds
// comma-separated numbers and ranges lo-hi; a range keeps the width of its lower
// bound, so "[08-10]" gives 08 09 10. An item with several bracket groups expands
// to their product, the last group varying fastest. Duplicates are kept.
//
// The error names the offending item: an empty item, an unbalanced or nested
// bracket, a range whose bounds are not decimal or are reversed, whitespace, or a
// list that expands to more than MaxHostlistHosts names.
func ParseHostlist(s string) ([]string, error) {
	if s == "" {
		return nil, errors.New("rank: hostlist: empty")
	}
	items, err := splitHostlist(s)
	if err != nil {
		return nil, err
	}
	var hosts []string
	for _, item := range items {
		hosts, err = expandHostItem(hosts, item)
		if err != nil {
			return nil, fmt.Errorf("rank: hostlist %q: item %q: %w", s, item, err)
		}
	}
	return hosts, nil
}

// splitHostlist splits s at the commas that are outside brackets.
func splitHostlist(s string) ([]string, error) {
	var items []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '[':
			if depth > 0 {
				return nil, fmt.Errorf("rank: hostlist %q: nested '[' at offset %d", s, i)
			}
			depth++
		case ']':
			if depth == 0 {
				return nil, fmt.Errorf("rank: hostlist %q: unmatched ']' at offset %d", s, i)
			}
			depth--
		case ',':
			if depth == 0 {
				items = append(items, s[start:i])
				start = i + 1
			}
		case ' ', '\t', '\n', '\r', '\v', '\f':
			return nil, fmt.Errorf("rank: hostlist %q: whitespace at offset %d", s, i)
		}
	}
	if depth > 0 {
		return nil, fmt.Errorf("rank: hostlist %q: unclosed '['", s)
	}
	items = append(items, s[start:])
	for _, item := range items {
		if item == "" {
			return nil, fmt.Errorf("rank: hostlist %q: empty item", s)
		}
	}
	return items, nil
}

// expandHostItem appends the names of one item (no top-level commas, brackets
// balanced and not nested) to hosts.
func expandHostItem(hosts []string, item string) ([]string, error) {
	// prefixes are the names expanded so far; each bracket group multiplies them.
	prefixes := []string{""}
	rest := item
	for rest != "" {
		open := strings.IndexByte(rest, '[')
		if open < 0 {
			prefixes = appendToAll(prefixes, rest)
			break
		}
		prefixes = appendToAll(prefixes, rest[:open])
		closing := strings.IndexByte(rest, ']')
		values, err := expandBracket(rest[open+1 : closing])
		if err != nil {
			return nil, err
		}
		if len(hosts)+len(prefixes)*len(values) > MaxHostlistHosts {
			return nil, fmt.Errorf("expands to more than %d hosts", MaxHostlistHosts)
		}
		next := make([]string, 0, len(prefixes)*len(values))
		for _, p := range prefixes {
			for _, v := range values {
				next = append(next, p+v)
			}
		}
		prefixes = next
		rest = rest[closing+1:]
	}
	if len(hosts)+len(prefixes) > MaxHostlistHosts {
		return nil, fmt.Errorf("expands to more than %d hosts", MaxHostlistHosts)
	}
	return append(hosts, prefixes...), nil
}

func appendToAll(names []string, s string) []string {
	if s == "" {
		return names
	}
	for i := range names {
		names[i] += s
	}
	return names
}

// expandBracket expands the inside of one bracket group: "01-04,07".
func expandBracket(body string) ([]string, error) {
	if body == "" {
		return nil, errors.New("empty brackets")
	}
	var out []string
	for _, part := range strings.Split(body, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		if !isDecimal(lo) || (isRange && !isDecimal(hi)) {
			return nil, fmt.Errorf("range %q: want N or N-M with decimal N and M", part)
		}
		if !isRange {
			out = append(out, lo)
			continue
		}
		// Bounds longer than 18 digits do not fit an int64; ranges that long
		// would exceed MaxHostlistHosts anyway unless the bounds are equal.
		a, errA := strconv.ParseUint(lo, 10, 63)
		b, errB := strconv.ParseUint(hi, 10, 63)
		if errA != nil || errB != nil {
			return nil, fmt.Errorf("range %q: bound out of range", part)
		}
		if a > b {
			return nil, fmt.Errorf("range %q: lower bound above upper bound", part)
		}
		if b-a >= MaxHostlistHosts || len(out)+int(b-a)+1 > MaxHostlistHosts {
			return nil, fmt.Errorf("range %q: expands to more than %d hosts", part, MaxHostlistHosts)
		}
		width := len(lo)
		for n := a; n <= b; n++ {
			v := strconv.FormatUint(n, 10)
			if len(v) < width {
				v = strings.Repeat("0", width-len(v)) + v
			}
			out = append(out, v)
		}
	}
	return out, nil
}

func isDecimal(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
