package gmi

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// MIGProfile is a parsed MIG profile name such as "1c.2g.10gb+me": a compute
// instance of 1 slice in a GPU instance of 2 slices and 10 GB, with media
// extensions.
type MIGProfile struct {
	// ComputeSlices is the compute instance's slice count when it is smaller
	// than the GPU instance ("1c." in "1c.2g.10gb"), else 0.
	ComputeSlices int
	// Slices is the GPU instance's slice count (of 7 on an A100 or H100).
	Slices int
	// MemoryGB is the GPU instance's memory, as the profile name rounds it.
	MemoryGB int
	// Attrs are the attribute suffixes, "+me", "+gfx", "-me", kept as written.
	Attrs string
}

// ParseMIGProfile reads a profile name: [Cc.]Gg.Mgb followed by any attribute
// suffixes (+me, -me, +gfx).
func ParseMIGProfile(s string) (MIGProfile, error) {
	bad := func(why string) (MIGProfile, error) {
		return MIGProfile{}, fmt.Errorf("gmi: MIG profile %q: %s (want a name such as 1g.10gb or 1c.2g.10gb+me)", s, why)
	}
	var p MIGProfile
	rest := s
	if i := strings.IndexAny(rest, "+-"); i >= 0 {
		p.Attrs = rest[i:]
		rest = rest[:i]
		for _, a := range splitAttrs(p.Attrs) {
			if len(a) < 2 || !isLowerWord(a[1:]) {
				return bad("bad attribute " + strconv.Quote(a))
			}
		}
	}
	parts := strings.Split(rest, ".")
	num := func(part, unit string) (int, bool) {
		d, ok := strings.CutSuffix(part, unit)
		if !ok || !allDigits(d) {
			return 0, false
		}
		n, err := strconv.Atoi(d)
		return n, err == nil && n > 0 && n < 1<<20
	}
	switch len(parts) {
	case 3:
		c, ok := num(parts[0], "c")
		if !ok {
			return bad("bad compute slices " + strconv.Quote(parts[0]))
		}
		p.ComputeSlices = c
		parts = parts[1:]
	case 2:
	default:
		return bad("wrong number of fields")
	}
	g, ok := num(parts[0], "g")
	if !ok {
		return bad("bad slice count " + strconv.Quote(parts[0]))
	}
	m, ok := num(parts[1], "gb")
	if !ok {
		return bad("bad memory " + strconv.Quote(parts[1]))
	}
	p.Slices, p.MemoryGB = g, m
	if p.ComputeSlices >= p.Slices {
		return bad("compute slices must be fewer than the GPU instance's")
	}
	return p, nil
}

// String writes the profile name back: ParseMIGProfile(p.String()) == p.
func (p MIGProfile) String() string {
	var b strings.Builder
	if p.ComputeSlices > 0 {
		fmt.Fprintf(&b, "%dc.", p.ComputeSlices)
	}
	fmt.Fprintf(&b, "%dg.%dgb%s", p.Slices, p.MemoryGB, p.Attrs)
	return b.String()
}

func splitAttrs(s string) []string {
	var out []string
	start := 0
	for i := 1; i <= len(s); i++ {
		if i == len(s) || s[i] == '+' || s[i] == '-' {
			out = append(out, s[start:i])
			start = i
		}
	}
	return out
}

func isLowerWord(s string) bool {
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '.' {
			return false
		}
	}
	return s != ""
}

// migProfileName names a MIG instance as nvidia-smi does, from what NVML
// reports: the GPU instance's slices and memory, the compute instance's
// slices, the GPU's total memory (to round the memory to the profile's GB
// figure) and the attribute suffix.
//
// The memory figure follows NVIDIA's device plugin: the instance's fraction of
// the GPU's memory, rounded up to eighths, times the GPU's memory in whole GiB.
// On a 40 GB A100, 4864 MiB is 1g.5gb, 9856 MiB 2g.10gb, 19968 MiB 3g.20gb.
func migProfileName(giSlices, ciSlices uint32, memMiB, gpuBytes uint64, attrs string) string {
	var gb int
	if gpuBytes > 0 {
		frac := float64(memMiB<<20) / float64(gpuBytes)
		frac = math.Ceil(frac*8) / 8
		totalGiB := math.Ceil(float64(gpuBytes) / (1 << 30))
		gb = int(math.Round(frac * totalGiB))
	} else {
		gb = int(math.Round(float64(memMiB) / 1024))
	}
	p := MIGProfile{Slices: int(giSlices), MemoryGB: gb, Attrs: attrs}
	if ciSlices > 0 && ciSlices < giSlices {
		p.ComputeSlices = int(ciSlices)
	}
	return p.String()
}
