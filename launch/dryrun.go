package launch

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"gear/rank"
)

// rdzvAtLaunch stands for the coordinator's address when its port is chosen at
// launch.
func (p *Plan) shownRdzvAddr() string {
	if strings.HasSuffix(p.RdzvAddr, ":0") {
		return p.RdzvAddr + " (port chosen at launch)"
	}
	return p.RdzvAddr
}

// WriteText prints the plan for people (gearrun --dry-run). The token is masked.
func (p *Plan) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "job %s: %d ranks on %d node(s)\n", p.JobID, len(p.Ranks), p.NumNodes)
	fmt.Fprintf(&b, "rendezvous %s, timeout %v, token %s\n", p.shownRdzvAddr(), time.Duration(p.RdzvTimeout), maskedToken)
	if p.Dir != "" {
		fmt.Fprintf(&b, "directory %s\n", p.Dir)
	}
	for _, role := range p.Roles {
		name := role.Name
		if name == "" {
			name = `""`
		}
		fmt.Fprintf(&b, "role %s: ranks %s\n", name, rank.FormatRanks(role.Ranks))
	}
	for _, kv := range p.Env {
		fmt.Fprintf(&b, "env %s\n", kv)
	}
	for _, r := range p.Ranks {
		fmt.Fprintf(&b, "rank %d: local %d/%d node %d role %q/%d:", r.Rank, r.LocalRank, r.LocalSize, r.Node, r.Role, r.RoleRank)
		for _, a := range r.Argv {
			b.WriteByte(' ')
			b.WriteString(shellWord(a))
		}
		if r.GoPackage {
			b.WriteString("  (Go package, built at launch)")
		}
		b.WriteByte('\n')
		if d := r.Device; d != (Device{}) {
			fmt.Fprintf(&b, "  device")
			if d.VisibleDevices != "" {
				fmt.Fprintf(&b, " %s=%s", rank.EnvCUDAVisibleDevices, d.VisibleDevices)
			}
			if d.MPSThreadPercent > 0 {
				fmt.Fprintf(&b, " %s=%d", rank.EnvMPSThreadPercent, d.MPSThreadPercent)
			}
			if d.MPSPinnedMemLimit != "" {
				fmt.Fprintf(&b, " %s=%s", rank.EnvMPSPinnedMemLimit, d.MPSPinnedMemLimit)
			}
			b.WriteByte('\n')
		}
		for _, kv := range r.Env {
			fmt.Fprintf(&b, "  env %s\n", kv)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// dryRank is a rank as --dry-run --json prints it: the spec and the whole
// environment addition, token masked.
type dryRank struct {
	RankSpec
	Environ []string `json:"environ"`
}

// WriteJSON prints the plan as JSON (gearrun --dry-run --json): the plan's fields,
// and for each rank the variables it would get. The token is masked.
func (p *Plan) WriteJSON(w io.Writer) error {
	m := p.Masked()
	out := struct {
		*Plan
		Ranks []dryRank `json:"ranks"`
	}{Plan: m}
	for i := range m.Ranks {
		out.Ranks = append(out.Ranks, dryRank{RankSpec: m.Ranks[i], Environ: m.Environ(i, m.RdzvAddr)})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// shellWord quotes s for display when it holds characters a shell would treat
// specially.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:@,+%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
