package launch

import (
	"bufio"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/gear-rl/gear/rank"
)

// Host is one host of a multi-host job and the number of ranks it takes, as
// mpirun's -H and hostfiles give them.
type Host struct {
	// Name is how ssh reaches the host ("node1", "user@node1", "10.0.0.2"); the
	// host's ranks get it as GEAR_NODE_NAME.
	Name  string `json:"name"`
	Slots int    `json:"slots"`
}

// String is the host in -H syntax ("node1:2").
func (h Host) String() string { return h.Name + ":" + strconv.Itoa(h.Slots) }

// ParseHostList parses mpirun's -H list: "host1:2,host2:2,host3"; a host
// without a count has one slot. A host named twice gets the slots of both.
func ParseHostList(s string) ([]Host, error) {
	var hosts []Host
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("launch: -H %q: empty host name", s)
		}
		name, count, hasCount := item, "", false
		if i := strings.LastIndexByte(item, ':'); i >= 0 && !strings.Contains(item[:i], ":") {
			name, count, hasCount = item[:i], item[i+1:], true
		}
		slots := 1
		if hasCount {
			n, err := strconv.Atoi(count)
			if err != nil || n < 1 || n > rank.MaxWorldSize {
				return nil, fmt.Errorf("launch: -H %q: host %q: slots %q: want a number from 1 to %d", s, name, count, rank.MaxWorldSize)
			}
			slots = n
		}
		if err := checkHostName(name); err != nil {
			return nil, fmt.Errorf("launch: -H %q: %w", s, err)
		}
		hosts = addHost(hosts, Host{Name: name, Slots: slots})
	}
	return hosts, nil
}

// ParseHostfile reads mpirun's hostfile format: one host a line, "node1
// slots=2" or a bare "node1" (one slot); "max_slots=N" is accepted and
// ignored; '#' starts a comment; blank lines are skipped. A host named twice
// gets the slots of both. Errors name the file (name) and the line.
func ParseHostfile(name string, r io.Reader) ([]Host, error) {
	var hosts []Host
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		text, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		where := fmt.Sprintf("launch: hostfile %s:%d", name, line)
		h := Host{Name: fields[0], Slots: 1}
		if err := checkHostName(h.Name); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if strings.Contains(h.Name, "=") {
			return nil, fmt.Errorf("%s: %q: want a host name first (host slots=N)", where, h.Name)
		}
		seen := map[string]bool{}
		for _, f := range fields[1:] {
			key, value, ok := strings.Cut(f, "=")
			if !ok {
				return nil, fmt.Errorf("%s: %q: want key=value after the host (slots=N)", where, f)
			}
			if seen[key] {
				return nil, fmt.Errorf("%s: %s given twice", where, key)
			}
			seen[key] = true
			n, err := strconv.Atoi(value)
			switch key {
			case "slots", "max_slots", "max-slots":
				if err != nil || n < 1 || n > rank.MaxWorldSize {
					return nil, fmt.Errorf("%s: %s: want a number from 1 to %d", where, f, rank.MaxWorldSize)
				}
			default:
				return nil, fmt.Errorf("%s: unknown key %q (want slots=N)", where, key)
			}
			if key == "slots" {
				h.Slots = n
			}
		}
		hosts = addHost(hosts, h)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("launch: hostfile %s: %w", name, err)
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("launch: hostfile %s: no hosts", name)
	}
	return hosts, nil
}

func checkHostName(name string) error {
	if name == "" {
		return errors.New("empty host name")
	}
	if strings.HasPrefix(name, "-") || strings.ContainsAny(name, " \t\n\x00'\"`$;&|<>()\\*?") {
		return fmt.Errorf("host %q: not a host name", name)
	}
	return nil
}

// addHost appends h, or adds its slots to an earlier entry of the same name.
func addHost(hosts []Host, h Host) []Host {
	for i := range hosts {
		if hosts[i].Name == h.Name {
			hosts[i].Slots += h.Slots
			return hosts
		}
	}
	return append(hosts, h)
}

// PlaceOnHosts puts the plan's ranks on hosts, filling each host's slots in
// order across the MPMD groups (host1:2,host2:2 gives host1 ranks 0-1 and
// host2 ranks 2-3); hosts left without a rank are not part of the job. It
// sets each rank's Host, Node, LocalRank and LocalSize, the plan's Hosts and
// NumNodes, and torch's MASTER_ADDR (rank 0's host) and MASTER_PORT (29500
// plus a number from the job ID, below 1000, as under SLURM) unless set.
// A plan with GPU bindings or Go packages cannot be placed: its bindings
// were planned for this machine, and its packages are built here.
func (p *Plan) PlaceOnHosts(hosts []Host) error {
	if len(hosts) == 0 {
		return errors.New("launch: no hosts")
	}
	total := 0
	for _, h := range hosts {
		if h.Slots < 1 {
			return fmt.Errorf("launch: host %s: %d slots: want at least 1", h.Name, h.Slots)
		}
		total += h.Slots
	}
	if len(p.Ranks) > total && p.MinSize > 0 && total >= p.MinSize {
		// An elastic job takes the slots there are.
		p.resize(total)
	}
	if len(p.Ranks) > total {
		list := make([]string, len(hosts))
		for i, h := range hosts {
			list[i] = h.String()
		}
		if p.MinSize > 0 {
			return fmt.Errorf("launch: -np %d:%d: at least %d ranks but the hosts have %d slots (%s)", p.MinSize, p.MaxSize, p.MinSize, total, strings.Join(list, ","))
		}
		return fmt.Errorf("launch: %d ranks but the hosts have %d slots (%s)", len(p.Ranks), total, strings.Join(list, ","))
	}
	for _, r := range p.Ranks {
		if r.GoPackage {
			return fmt.Errorf("launch: rank %d: %s is a Go package; on other hosts run a binary (go build it first)", r.Rank, r.Argv[0])
		}
		if r.Device != (Device{}) {
			return fmt.Errorf("launch: rank %d: GPU binding is planned for this machine only; it cannot be combined with hosts yet", r.Rank)
		}
	}
	p.Hosts = nil
	p.HostSlots = append([]Host(nil), hosts...)
	next := 0
	for _, h := range hosts {
		if next == len(p.Ranks) {
			break
		}
		n := min(h.Slots, len(p.Ranks)-next)
		node := len(p.Hosts)
		p.Hosts = append(p.Hosts, h.Name)
		for i := range n {
			r := &p.Ranks[next+i]
			r.Host, r.Node, r.LocalRank, r.LocalSize = h.Name, node, i, n
		}
		next += n
	}
	p.NumNodes = len(p.Hosts)
	if p.TorchEnv {
		p.MasterAddr = hostAddr(p.Hosts[0])
		if p.MasterPort == 0 {
			f := fnv.New32a()
			f.Write([]byte(p.JobID))
			p.MasterPort = 29500 + int(f.Sum32()%1000)
		}
	}
	return nil
}

// Survivors returns the plan of a world without the hosts gone: placed on
// the job's other hosts (HostSlots, in order), with the same number of ranks
// if their slots hold them, else, for an elastic plan, as many as they hold
// if that is at least MinSize. The error names what is left and what the
// job needs. p is left as it is.
func (p *Plan) Survivors(gone []string) (*Plan, error) {
	var left []Host
	total := 0
	for _, h := range p.HostSlots {
		if !slices.Contains(gone, h.Name) {
			left = append(left, h)
			total += h.Slots
		}
	}
	want, need := len(p.Ranks), len(p.Ranks)
	if p.MinSize > 0 {
		want, need = p.MaxSize, p.MinSize
	}
	if total < need {
		names := make([]string, len(left))
		for i, h := range left {
			names[i] = h.String()
		}
		where := "no host is left"
		if len(left) > 0 {
			where = fmt.Sprintf("%d slots are left (%s)", total, strings.Join(names, ","))
		}
		if p.MinSize > 0 {
			return nil, fmt.Errorf("%s, fewer than the %d ranks the job needs at least (-np %d:%d)", where, p.MinSize, p.MinSize, p.MaxSize)
		}
		return nil, fmt.Errorf("%s, fewer than the job's %d ranks", where, need)
	}
	q := *p
	q.Ranks = slices.Clone(p.Ranks)
	q.Roles = slices.Clone(p.Roles)
	for i := range q.Roles {
		q.Roles[i].Ranks = slices.Clone(p.Roles[i].Ranks)
	}
	q.resize(min(want, total))
	if err := q.PlaceOnHosts(left); err != nil {
		return nil, err
	}
	return &q, nil
}

// resize gives an elastic plan (one group) n ranks, alike but for their
// numbers.
func (p *Plan) resize(n int) {
	if n == len(p.Ranks) || len(p.Ranks) == 0 {
		return
	}
	tmpl := p.Ranks[0]
	ranks := make([]RankSpec, n)
	role := make([]int, n)
	for i := range ranks {
		r := tmpl
		r.Argv = slices.Clone(tmpl.Argv)
		r.Rank, r.RoleRank, r.LocalRank, r.LocalSize = i, i, i, n
		ranks[i], role[i] = r, i
	}
	p.Ranks = ranks
	p.Roles = []RoleSpec{{Name: tmpl.Role, Ranks: role}}
}

// HostRanks returns the ranks the plan puts on host (PlaceOnHosts).
func (p *Plan) HostRanks(host string) []int {
	var out []int
	for _, r := range p.Ranks {
		if r.Host == host {
			out = append(out, r.Rank)
		}
	}
	return out
}

// hostAddr is the network part of an ssh destination ("user@node1" -> "node1").
func hostAddr(dest string) string {
	if i := strings.LastIndexByte(dest, '@'); i >= 0 {
		return dest[i+1:]
	}
	return dest
}

// IsLoopbackHost reports whether host names this machine's loopback
// ("localhost", 127.0.0.1, ::1).
func IsLoopbackHost(host string) bool {
	h := hostAddr(host)
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// RdzvAddrFor returns the address ("IP:0") on which the coordinator of a job
// on hosts should listen: this machine's address on the route to the first
// host that is not loopback (no packet is sent), or 127.0.0.1 when every
// host is.
func RdzvAddrFor(hosts []Host) (string, error) {
	for _, h := range hosts {
		if IsLoopbackHost(h.Name) {
			continue
		}
		addr := hostAddr(h.Name)
		ips, err := net.LookupHost(addr)
		if err != nil || len(ips) == 0 {
			return "", fmt.Errorf("launch: host %s: cannot resolve %s to choose the rendezvous address (give --rdzv-addr): %v", h.Name, addr, err)
		}
		c, err := net.Dial("udp", net.JoinHostPort(ips[0], "22"))
		if err != nil {
			return "", fmt.Errorf("launch: host %s: no route to %s to choose the rendezvous address (give --rdzv-addr): %w", h.Name, ips[0], err)
		}
		local := c.LocalAddr().(*net.UDPAddr).IP
		c.Close()
		return net.JoinHostPort(local.String(), "0"), nil
	}
	return "127.0.0.1:0", nil
}

// hostRanksText is "ranks 2-3" or "rank 2".
func hostRanksText(ranks []int) string {
	if len(ranks) == 1 {
		return "rank " + strconv.Itoa(ranks[0])
	}
	return "ranks " + rank.FormatRanks(ranks)
}
