package collective_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/internal/geartest"
	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
)

// TestMultiHost runs a job whose ranks sit on two "hosts": two network
// namespaces joined through a bridge (veth pairs), two ranks in each. Ranks of one namespace
// share memory; across the pair they talk TCP; AllReduce is hierarchical. The test
// needs root (ip netns add); elsewhere it is skipped with a message.
//
// The test process makes the namespaces and the veth pair, then runs itself
// inside namespace A as the launcher (GEARTEST_NETNS=launcher) so that the
// rendezvous listens on A's end of the pair; the launcher starts A's ranks
// directly and B's through "ip netns exec". Every process runs this same test
// function and does its part.
func TestMultiHost(t *testing.T) {
	switch os.Getenv("GEARTEST_NETNS") {
	case "launcher":
		multiHostLauncher(t)
		return
	case "rank":
		multiHostRank(t)
		return
	}
	for _, tr := range []string{collective.TransportAuto, collective.TransportTCP} {
		t.Run(transportName(tr), func(t *testing.T) {
			nsA, nsB, ipA := makeNamespaces(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "ip", "netns", "exec", nsA, os.Args[0],
				"-test.run=^TestMultiHost$", "-test.v", "-test.count=1", "-test.timeout=2m")
			cmd.Env = append(os.Environ(), "GEARTEST_NETNS=launcher", "GEARTEST_NS_B="+nsB,
				"GEARTEST_IP_A="+ipA, "GEARTEST_TRANSPORT="+tr)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			for r := range 4 {
				if !strings.Contains(out.String(), fmt.Sprintf("GEARTEST %d ok", r)) {
					t.Errorf("rank %d did not report success", r)
				}
			}
			if err != nil || t.Failed() {
				t.Fatalf("launcher in %s: %v\n%s", nsA, err, out.String())
			}
			for _, line := range strings.Split(out.String(), "\n") {
				if strings.Contains(line, "GEARTEST") {
					t.Log(strings.TrimSpace(line))
				}
			}
		})
	}
}

// makeNamespaces creates two namespaces, each joined by a veth pair to a
// bridge in a third (the switch between two hosts), in 10.237.N.0/24; all are
// removed when t ends (deleting a namespace deletes the veth ends and the
// bridge in it). Without root or iproute2, t is skipped.
func makeNamespaces(t *testing.T) (nsA, nsB, ipA string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("multi-host test: needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("multi-host test: no ip command (iproute2)")
	}
	var b [3]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	nsA, nsB, nsS := "gearA-"+id, "gearB-"+id, "gearS-"+id
	vA, vB, sA, sB := "gva"+id, "gvb"+id, "gsa"+id, "gsb"+id
	net := fmt.Sprintf("10.237.%d", b[0])
	ipA, ipB := net+".1", net+".2"
	run := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := run("netns", "add", nsA); err != nil {
		t.Skipf("multi-host test: cannot create network namespaces here: %v", err)
	}
	t.Cleanup(func() {
		for _, ns := range []string{nsA, nsB, nsS} {
			run("netns", "del", ns)
		}
		// Deleting the namespaces removes the veth pairs and the bridge;
		// check nothing is left.
		if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), id) {
			t.Errorf("namespaces left behind: %s", out)
		}
		if out, _ := exec.Command("ip", "link", "show").Output(); strings.Contains(string(out), id) {
			t.Errorf("veth left behind: %s", out)
		}
	})
	for _, args := range [][]string{
		{"netns", "add", nsB},
		{"netns", "add", nsS},
		{"-n", nsS, "link", "add", "br0", "type", "bridge"},
		{"-n", nsS, "link", "set", "br0", "up"},
		{"link", "add", vA, "type", "veth", "peer", "name", sA},
		{"link", "add", vB, "type", "veth", "peer", "name", sB},
		{"link", "set", vA, "netns", nsA},
		{"link", "set", vB, "netns", nsB},
		{"link", "set", sA, "netns", nsS},
		{"link", "set", sB, "netns", nsS},
		{"-n", nsS, "link", "set", sA, "master", "br0"},
		{"-n", nsS, "link", "set", sB, "master", "br0"},
		{"-n", nsS, "link", "set", sA, "up"},
		{"-n", nsS, "link", "set", sB, "up"},
		{"-n", nsA, "addr", "add", ipA + "/24", "dev", vA},
		{"-n", nsB, "addr", "add", ipB + "/24", "dev", vB},
		{"-n", nsA, "link", "set", vA, "up"},
		{"-n", nsB, "link", "set", vB, "up"},
		{"-n", nsA, "link", "set", "lo", "up"},
		{"-n", nsB, "link", "set", "lo", "up"},
	} {
		if err := run(args...); err != nil {
			// Links still in the root namespace go with their own deletion.
			run("link", "del", vA)
			run("link", "del", vB)
			t.Fatal(err)
		}
	}
	return nsA, nsB, ipA
}

// multiHostLauncher runs inside namespace A: two ranks here, two in B.
func multiHostLauncher(t *testing.T) {
	argv := []string{os.Args[0], "-test.run=^TestMultiHost$", "-test.v", "-test.count=1", "-test.timeout=2m"}
	common := []string{"GEARTEST_NETNS=rank", "GEAR_TRANSPORT=" + os.Getenv("GEARTEST_TRANSPORT")}
	plan, err := launch.NewPlan(launch.Request{
		Groups: []launch.Group{
			{Role: "a", NP: 2, Argv: argv, Env: common},
			{Role: "b", NP: 2, Argv: append([]string{"ip", "netns", "exec", os.Getenv("GEARTEST_NS_B")}, argv...), Env: common},
		},
		RdzvAddr:    os.Getenv("GEARTEST_IP_A") + ":0",
		RdzvTimeout: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out geartest.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	_, err = launch.Run(ctx, plan, launch.Options{Stdout: &out, Stderr: &out, TagOutput: true, Timeout: time.Minute, Name: "multihost"})
	fmt.Print(out.String())
	if err != nil {
		t.Fatalf("job: %v", err)
	}
}

// multiHostRank is one rank of the job.
func multiHostRank(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := rank.Init(ctx)
	if err != nil {
		t.Fatalf("rank.Init: %v", err)
	}
	defer w.Close()
	// The TCP listen address comes from the world (World.ListenHost: the
	// address this rank reaches the rendezvous from, on its side of the veth).
	c, err := collective.New(ctx, w, collective.WithTransport(os.Getenv(rank.EnvTransport)))
	if err != nil {
		t.Fatalf("collective.New: %v", err)
	}
	defer c.Close()
	hosts := c.Hosts()
	if len(hosts) != 2 || len(hosts[0]) != 2 || len(hosts[1]) != 2 {
		t.Fatalf("rank %d: hosts %v, want two hosts of two ranks", w.Rank(), hosts)
	}
	// The two namespaces share this machine's kernel, so its CPUs: all four
	// ranks count.
	if got := c.CPURanks(); got != 4 {
		t.Fatalf("rank %d: CPURanks() = %d, want 4 (two namespaces of one machine)", w.Rank(), got)
	}
	for _, count := range []int{0, 1, 13, 4001, 100003, 4 << 20} {
		for _, op := range allOps {
			if err := allReduceCase[int64](count, op)(ctx, c); err != nil {
				t.Fatalf("rank %d: count %d %v: %v", w.Rank(), count, op, err)
			}
		}
		if err := allReduceCase[float32](count, collective.Sum)(ctx, c); err != nil {
			t.Fatalf("rank %d: count %d: %v", w.Rank(), count, err)
		}
		for _, fn := range []rankFunc{broadcastCase[byte](count, 3), allGatherCase[float64](count), allToAllCase[int32](count / 4), reduceScatterCase[float32](count/4, collective.Sum)} {
			if err := fn(ctx, c); err != nil {
				t.Fatalf("rank %d: count %d: %v", w.Rank(), count, err)
			}
		}
	}
	if err := c.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("GEARTEST %d ok (host %s)\n", w.Rank(), w.Host())
}
