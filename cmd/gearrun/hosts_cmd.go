package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
)

// envSSH holds the ssh options gearrun uses when --ssh is not given.
const envSSH = "GEAR_SSH"

// hostFlags are the flags that put a launch on other hosts.
type hostFlags struct {
	hosts         string
	hostfile      string
	ssh           string
	remoteGearrun string
	rdzvSet       bool // --rdzv-addr was given
}

func (h *hostFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&h.hosts, "H", "", "run on these hosts over ssh: `host1:2,host2:2` (slots per host; a bare host has 1), filled in order as mpirun's -H")
	fs.StringVar(&h.hosts, "host", "", "same as -H")
	fs.StringVar(&h.hostfile, "hostfile", "", "run on the hosts of this `FILE` over ssh (mpirun's format: 'host slots=N' lines)")
	fs.StringVar(&h.ssh, "ssh", "", "ssh options for -H/--hostfile, as one string (\"-p 2222 -i key\"); default $"+envSSH+"; BatchMode=yes is always set")
	fs.StringVar(&h.remoteGearrun, "remote-gearrun", "", "with -H/--hostfile: the gearrun command on the hosts (default: this gearrun's path)")
}

// on reports whether the launch goes to other hosts.
func (h hostFlags) on() bool { return h.hosts != "" || h.hostfile != "" }

// check refuses contradictory host flags.
func (h hostFlags) check() error {
	if h.hosts != "" && h.hostfile != "" {
		return errors.New("-H and --hostfile: give one")
	}
	if !h.on() && (h.ssh != "" || h.remoteGearrun != "") {
		return errors.New("--ssh and --remote-gearrun need -H or --hostfile")
	}
	return nil
}

// list reads the hosts from -H or the hostfile.
func (h hostFlags) list() ([]launch.Host, error) {
	if h.hosts != "" {
		return launch.ParseHostList(h.hosts)
	}
	f, err := os.Open(h.hostfile)
	if err != nil {
		return nil, fmt.Errorf("hostfile: %w", err)
	}
	defer f.Close()
	return launch.ParseHostfile(h.hostfile, f)
}

// remote says how to reach the hosts: ssh with --ssh (or $GEAR_SSH) options,
// and the gearrun command on them.
func (h hostFlags) remote() (launch.Remote, error) {
	opts := h.ssh
	if opts == "" {
		opts = os.Getenv(envSSH)
	}
	words, err := splitWords(opts)
	if err != nil {
		return launch.Remote{}, fmt.Errorf("--ssh %q: %w", opts, err)
	}
	rem := launch.Remote{SSH: append([]string{"ssh"}, words...), Gearrun: h.remoteGearrun}
	if rem.Gearrun == "" {
		self, err := os.Executable()
		if err != nil {
			return rem, fmt.Errorf("--remote-gearrun: this gearrun's path: %w", err)
		}
		rem.Gearrun = shellQuote(self)
	}
	return rem, nil
}

// splitWords splits s into words as a POSIX shell would, with '...', "..."
// and backslashes, and nothing else (no variables, no globs).
func splitWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("unterminated '")
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("\"\\$`", s[i+1]) >= 0 {
					i++
				}
				cur.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, errors.New(`unterminated "`)
			}
			inWord = true
		case c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			inWord = true
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// shellQuote quotes s for a POSIX shell where it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:@,+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// writeHostsText ends a dry run's text with the hosts and how each is reached.
func writeHostsText(w io.Writer, plan *launch.Plan, h hostFlags) error {
	rem, err := h.remote()
	if err != nil {
		return err
	}
	ssh := []string{shellQuote(rem.SSH[0]), "-o", "BatchMode=yes"}
	for _, a := range rem.SSH[1:] {
		ssh = append(ssh, shellQuote(a))
	}
	ssh = append(ssh, "HOST", shellQuote(rem.Gearrun+" agent"))
	var b strings.Builder
	fmt.Fprintf(&b, "over ssh: %s\n", strings.Join(ssh, " "))
	for i, name := range plan.Hosts {
		fmt.Fprintf(&b, "host %d %s: ranks %s\n", i, name, rank.FormatRanks(plan.HostRanks(name)))
	}
	_, err = io.WriteString(w, b.String())
	return err
}

// runOnHosts runs plan on its hosts with opts, as runPlan does locally.
func runOnHosts(plan *launch.Plan, opts launch.Options, rem launch.Remote, s stdio) int {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	opts.Stdout, opts.Stderr, opts.Signals = s.out, s.err, sigs
	job := startLocalJob(plan, "", opts.Verbose, s)
	res, err := launch.RunOnHosts(context.Background(), plan, opts, rem)
	code := jobExitCode(s, res, err)
	job.end(code)
	return code
}

// agentCommand is `gearrun agent`, which gearrun starts on each host over
// ssh (hidden from the usage: nobody runs it by hand). It reads its part of
// the job on stdin and runs it (launch.RunAgent). When the connection ends or
// its parent (sshd) dies, it kills its ranks.
func agentCommand(args []string, s stdio) int {
	if len(args) > 0 {
		fmt.Fprintln(s.err, "usage: gearrun agent (started by gearrun -H over ssh; reads its job on stdin)")
		return 2
	}
	lost := make(chan os.Signal, 1)
	signal.Notify(lost, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT)
	defer signal.Stop(lost)
	// A write to a connection that is gone must fail, not kill the agent
	// before it kills its ranks.
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, syscall.SIGPIPE)
	defer signal.Stop(pipe)
	ppid := os.Getppid()
	unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0, 0, 0)
	if os.Getppid() != ppid {
		return 1 // the parent died before the prctl
	}
	err := launch.RunAgent(context.Background(), launch.AgentOptions{In: s.in, Out: s.out, Lost: lost})
	if err != nil {
		fmt.Fprintf(s.err, "gearrun agent: %v\n", strings.TrimPrefix(err.Error(), "launch: "))
		return 1
	}
	return 0
}
