package launch

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/gear-rl/gear/rank"
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
	if p.MinSize > 0 {
		fmt.Fprintf(&b, "elastic size: %d to %d ranks (-np %d:%d)\n", p.MinSize, p.MaxSize, p.MinSize, p.MaxSize)
	}
	fmt.Fprintf(&b, "rendezvous %s, timeout %v, token %s\n", p.shownRdzvAddr(), time.Duration(p.RdzvTimeout), maskedToken)
	if p.HeartbeatInterval > 0 || p.HeartbeatTimeout > 0 {
		i, t := time.Duration(p.HeartbeatInterval), time.Duration(p.HeartbeatTimeout)
		fmt.Fprintf(&b, "heartbeat every %v, timeout %v: a silent rank is lost within %v\n",
			cmp.Or(i, rank.DefaultHeartbeat), cmp.Or(t, rank.DefaultHeartbeatTimeout), rank.DetectionTime(i, t))
	}
	if p.TorchEnv {
		port := "(a free port reserved at launch)"
		if p.MasterPort > 0 {
			port = strconv.Itoa(p.MasterPort)
		}
		fmt.Fprintf(&b, "torch env: %s=%s %s=%s\n", rank.EnvTorchMasterAddr, p.MasterAddr, rank.EnvTorchMasterPort, port)
	}
	if p.MaxRestarts > 0 {
		fmt.Fprintf(&b, "restarts: at most %d after a rank fails\n", p.MaxRestarts)
	}
	if p.CheckpointDir != "" {
		fmt.Fprintf(&b, "checkpoints %s\n", p.CheckpointDir)
	}
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
	for _, gp := range p.GPUPlans {
		gp.writeText(&b)
	}
	p.writeShmBudget(&b)
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
			if d.Backend != "" {
				fmt.Fprintf(&b, " %s:", d.where())
			}
			if d.VisibleDevices != "" {
				fmt.Fprintf(&b, " %s=%s", rank.EnvCUDAVisibleDevices, d.VisibleDevices)
			}
			if d.DeviceOrder != "" {
				fmt.Fprintf(&b, " %s=%s", rank.EnvCUDADeviceOrder, d.DeviceOrder)
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

// where says in words where a bound rank runs: "GPU 0 GMI 1 mps 33%",
// "GPU 1 GMI 0 mig 2g.10gb", "GPU 0", "GPUs 0,1".
func (d Device) where() string {
	switch {
	case d.Backend == "mig":
		return fmt.Sprintf("GPU %d GMI %d mig %s", d.GPU, d.GMI, d.MIGProfile)
	case d.Backend == "mps":
		return fmt.Sprintf("GPU %d GMI %d mps %d%%", d.GPU, d.GMI, d.MPSThreadPercent)
	case strings.Contains(d.VisibleDevices, ","):
		return "GPUs " + d.VisibleDevices
	}
	return fmt.Sprintf("GPU %d", d.GPU)
}

// writeText prints a group's GPU plan: where the GPUs came from, the
// placement and backend, the layout and strategy, and the warnings.
func (gp GPUPlan) writeText(b *strings.Builder) {
	role := gp.Role
	if role == "" {
		role = `""`
	}
	fmt.Fprintf(b, "gpus group %d (role %s, ranks %s): %s\n", gp.Group, role,
		rank.FormatRanks(rankRange(gp.FirstRank, gp.NP)), gp.Source)
	per := fmt.Sprintf("%d per GPU", gp.GMIPerGPU)
	if gp.GPUsPerRank > 1 {
		per = fmt.Sprintf("%d GPUs per rank", gp.GPUsPerRank)
	}
	fmt.Fprintf(b, "  GPUs %s, %s, backend %s (%s)\n", strings.TrimPrefix(formatInts(gp.GPUs), "GPUs "), per, gp.Backend, gp.Why)
	fmt.Fprintf(b, "  %s=%s, strategy %s (Algorithm 1: %s)\n", rank.EnvGMILayout, gp.Layout, gp.Strategy, gp.StrategyWhy)
	for _, w := range gp.Warnings {
		fmt.Fprintf(b, "  warning: %s\n", w)
	}
}

func rankRange(first, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = first + i
	}
	return out
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
		// ChosenAtLaunch names the variables whose values the plan cannot
		// know yet (the text form says "chosen at launch"), each with what
		// gearrun puts there when the job starts.
		ChosenAtLaunch map[string]string `json:"chosen_at_launch,omitempty"`
		Ranks          []dryRank         `json:"ranks"`
	}{Plan: m, ChosenAtLaunch: p.chosenAtLaunch()}
	for i := range m.Ranks {
		out.Ranks = append(out.Ranks, dryRank{RankSpec: m.Ranks[i], Environ: m.Environ(i, m.RdzvAddr)})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// chosenAtLaunch describes the values of the ranks' environment that Run
// picks as the job starts: the coordinator's port when RdzvAddr ends in ":0",
// and MASTER_PORT when the plan reserves none yet.
func (p *Plan) chosenAtLaunch() map[string]string {
	out := map[string]string{}
	if strings.HasSuffix(p.RdzvAddr, ":0") {
		out[rank.EnvRdzvAddr] = "port 0 stands for a free port the coordinator binds at launch"
	}
	if p.TorchEnv && p.MasterPort == 0 {
		out[rank.EnvTorchMasterPort] = "a free port reserved on " + rank.EnvTorchMasterAddr + " at launch (absent here)"
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// shellWord quotes s for display when it holds characters a shell would treat
// specially.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:@,+%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
