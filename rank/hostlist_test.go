package rank

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestParseHostlist(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"vm", []string{"vm"}},
		{"node1,node2", []string{"node1", "node2"}},
		{"gpu[01-04,07],cpu1", []string{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu1"}},
		{"n[1-3]", []string{"n1", "n2", "n3"}},
		{"n[8-11]", []string{"n8", "n9", "n10", "n11"}},
		{"n[08-11]", []string{"n08", "n09", "n10", "n11"}},
		{"n[098-101]", []string{"n098", "n099", "n100", "n101"}},
		{"n[7]", []string{"n7"}},
		{"n[007]", []string{"n007"}},
		{"rack[1-2]-node[01-02]", []string{"rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"}},
		{"a[1,3]b[5-6]c", []string{"a1b5c", "a1b6c", "a3b5c", "a3b6c"}},
		{"[1-2]x", []string{"1x", "2x"}},
		{"x[1-2],y[3],z", []string{"x1", "x2", "y3", "z"}},
		{"n[1-2],n1", []string{"n1", "n2", "n1"}},
		{"host-1.example.org", []string{"host-1.example.org"}},
		{"gpu[1-2].cluster[3-4]", []string{"gpu1.cluster3", "gpu1.cluster4", "gpu2.cluster3", "gpu2.cluster4"}},
	}
	for _, tt := range tests {
		got, err := ParseHostlist(tt.in)
		if err != nil {
			t.Errorf("ParseHostlist(%q): %v", tt.in, err)
			continue
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("ParseHostlist(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestParseHostlistErrors(t *testing.T) {
	tests := []struct {
		in, wantErr string
	}{
		{"", "empty"},
		{"a,,b", "empty item"},
		{"a,", "empty item"},
		{",a", "empty item"},
		{"n[1-2", "unclosed"},
		{"n1-2]", "unmatched ']'"},
		{"n[1-[2-3]]", "nested"},
		{"n[]", "empty brackets"},
		{"n[a-b]", `range "a-b"`},
		{"n[1-]", `range "1-"`},
		{"n[-1]", `range "-1"`},
		{"n[1-2-3]", `range "1-2-3"`},
		{"n[1,,2]", `range ""`},
		{"n[5-3]", "lower bound above upper bound"},
		{"n[0-99999999]", "more than 65536 hosts"},
		{"a[0-999]b[0-999]", "more than 65536 hosts"},
		{"n[1-99999999999999999999]", "out of range"},
		{"a b", "whitespace"},
		{"a\tb", "whitespace"},
	}
	for _, tt := range tests {
		got, err := ParseHostlist(tt.in)
		if err == nil {
			t.Errorf("ParseHostlist(%q) = %q, want an error containing %q", tt.in, got, tt.wantErr)
			continue
		}
		if !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "rank: hostlist") {
			t.Errorf("ParseHostlist(%q): error %q, want one starting \"rank: hostlist\" and containing %q", tt.in, err, tt.wantErr)
		}
	}
}

// naiveHostlist is the reference: it expands the first bracket group of an item by
// substitution and recurses. It assumes a list that ParseHostlist accepted.
func naiveHostlist(s string) []string {
	var out []string
	depth, start := 0, 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || (s[i] == ',' && depth == 0) {
			out = append(out, naiveItem(s[start:i])...)
			start = i + 1
			continue
		}
		switch s[i] {
		case '[':
			depth++
		case ']':
			depth--
		}
	}
	return out
}

func naiveItem(item string) []string {
	open := strings.Index(item, "[")
	if open < 0 {
		return []string{item}
	}
	closing := open + strings.Index(item[open:], "]")
	head, body, tail := item[:open], item[open+1:closing], item[closing+1:]
	var out []string
	for _, part := range strings.Split(body, ",") {
		lo, hi, ok := strings.Cut(part, "-")
		if !ok {
			// A single number is taken verbatim, however long.
			for _, rest := range naiveItem(tail) {
				out = append(out, head+lo+rest)
			}
			continue
		}
		a, _ := strconv.Atoi(lo)
		b, _ := strconv.Atoi(hi)
		for n := a; n <= b; n++ {
			v := fmt.Sprintf("%0*d", len(lo), n)
			for _, rest := range naiveItem(tail) {
				out = append(out, head+v+rest)
			}
		}
	}
	return out
}

func FuzzParseHostlist(f *testing.F) {
	for _, s := range []string{
		"vm", "gpu[01-04,07],cpu1", "rack[1-2]-node[01-02]", "n[098-101]", "a,b",
		"n[1-[2]]", "n[5-3]", "x[1-2],y[3],z", "[1]", "n[0-0]", "a[1,3]b[5-6]c",
		"[1000000000000000000000000000]", "n[999999999999999990-999999999999999999]",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		hosts, err := ParseHostlist(s)
		if err != nil {
			if hosts != nil {
				t.Fatalf("ParseHostlist(%q) returned hosts and error %v", s, err)
			}
			return
		}
		if len(hosts) == 0 || len(hosts) > MaxHostlistHosts {
			t.Fatalf("ParseHostlist(%q) returned %d hosts", s, len(hosts))
		}
		for _, h := range hosts {
			if h == "" || strings.ContainsAny(h, "[], \t\n\r\v\f") {
				t.Fatalf("ParseHostlist(%q) returned host %q", s, h)
			}
		}
		if !strings.Contains(s, "[") && !slices.Equal(hosts, strings.Split(s, ",")) {
			t.Fatalf("ParseHostlist(%q) = %q, want the plain comma split", s, hosts)
		}
		// Expanded names are a hostlist of their own that expands to itself.
		again, err := ParseHostlist(strings.Join(hosts, ","))
		if err != nil || !slices.Equal(again, hosts) {
			t.Fatalf("ParseHostlist(join(ParseHostlist(%q))) = %q, %v", s, again, err)
		}
		if len(hosts) <= 4096 {
			if want := naiveHostlist(s); !slices.Equal(hosts, want) {
				t.Fatalf("ParseHostlist(%q) = %q, naive expansion %q", s, hosts, want)
			}
		}
	})
}
