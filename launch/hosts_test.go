package launch

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseHostList(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []Host
		err  string
	}{
		{in: "a:2,b:2", want: []Host{{"a", 2}, {"b", 2}}},
		{in: "a,b:3,c", want: []Host{{"a", 1}, {"b", 3}, {"c", 1}}},
		{in: "user@a:4", want: []Host{{"user@a", 4}}},
		{in: "a:1,b,a:2", want: []Host{{"a", 3}, {"b", 1}}},
		{in: "10.0.0.2:2", want: []Host{{"10.0.0.2", 2}}},
		{in: "a:0", err: `host "a": slots "0": want a number from 1 to 65536`},
		{in: "a:x", err: `slots "x"`},
		{in: "a,,b", err: "empty host name"},
		{in: "a;rm -rf", err: "not a host name"},
		{in: "-oProxyCommand=x", err: "not a host name"},
	} {
		got, err := ParseHostList(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseHostList(%q) = %v, %v; want error with %q", c.in, got, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("ParseHostList(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
}

func TestParseHostfile(t *testing.T) {
	good := "# cluster\n\nnode1 slots=2\nnode2   slots=2 max_slots=4  # big\n  node3\n\t# indented comment\nnode1 slots=1\n"
	got, err := ParseHostfile("hosts", strings.NewReader(good))
	want := []Host{{"node1", 3}, {"node2", 2}, {"node3", 1}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseHostfile = %v, %v; want %v", got, err, want)
	}
	for _, c := range []struct{ in, err string }{
		{"node1 slots=2\nnode2 slots=0\n", "hostfile hosts:2: slots=0: want a number from 1 to 65536"},
		{"node1\n\nnode2 slots=two\n", "hostfile hosts:3: slots=two"},
		{"node1 slots 2\n", `hostfile hosts:1: "slots": want key=value after the host`},
		{"node1 cpus=2\n", `hostfile hosts:1: unknown key "cpus" (want slots=N)`},
		{"node1 slots=2 slots=3\n", "hostfile hosts:1: slots given twice"},
		{"slots=2\n", `hostfile hosts:1: "slots=2": want a host name first`},
		{"node1\nno$de\n", `hostfile hosts:2: host "no$de": not a host name`},
		{"# nothing\n\n", "hostfile hosts: no hosts"},
	} {
		got, err := ParseHostfile("hosts", strings.NewReader(c.in))
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("ParseHostfile(%q) = %v, %v; want error with %q", c.in, got, err, c.err)
		}
	}
}

func TestPlaceOnHosts(t *testing.T) {
	p, err := NewPlan(Request{Groups: []Group{
		{NP: 3, Argv: []string{"./actor"}},
		{NP: 2, Argv: []string{"./trainer"}},
	}, IsGoPackage: func(string) bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.PlaceOnHosts([]Host{{"a", 2}, {"b", 2}, {"c", 4}, {"d", 1}}); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p.Hosts, []string{"a", "b", "c"}) || p.NumNodes != 3 {
		t.Fatalf("hosts %v, %d nodes; want a, b, c", p.Hosts, p.NumNodes)
	}
	type place struct {
		host               string
		node, local, lsize int
		role               string
	}
	want := []place{{"a", 0, 0, 2, "actor"}, {"a", 0, 1, 2, "actor"}, {"b", 1, 0, 2, "actor"}, {"b", 1, 1, 2, "trainer"}, {"c", 2, 0, 1, "trainer"}}
	for i, r := range p.Ranks {
		got := place{r.Host, r.Node, r.LocalRank, r.LocalSize, r.Role}
		if got != want[i] {
			t.Errorf("rank %d: %+v, want %+v", i, got, want[i])
		}
	}
	env := strings.Join(p.Environ(3, "10.0.0.1:5000"), "\n")
	for _, kv := range []string{"GEAR_NODE_NAME=b", "GEAR_NODE_RANK=1", "GEAR_NUM_NODES=3", "GEAR_LOCAL_RANK=1", "GEAR_LOCAL_SIZE=2", "MASTER_ADDR=a", "GROUP_WORLD_SIZE=3"} {
		if !strings.Contains(env+"\n", kv+"\n") {
			t.Errorf("rank 3's environment lacks %s:\n%s", kv, env)
		}
	}
	if p.MasterPort < 29500 || p.MasterPort >= 30500 {
		t.Errorf("MASTER_PORT %d: want 29500 to 30499", p.MasterPort)
	}
	if got := p.HostRanks("b"); !reflect.DeepEqual(got, []int{2, 3}) {
		t.Errorf("HostRanks(b) = %v", got)
	}

	err = p.PlaceOnHosts([]Host{{"a", 2}, {"b", 2}})
	if err == nil || err.Error() != "launch: 5 ranks but the hosts have 4 slots (a:2,b:2)" {
		t.Errorf("too few slots: %v", err)
	}
}

func TestPlaceOnHostsRefusesLocalOnlyPlans(t *testing.T) {
	p, err := NewPlan(Request{Groups: []Group{{NP: 1, Argv: []string{"./pkg"}}}, IsGoPackage: func(string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.PlaceOnHosts([]Host{{"a", 1}}); err == nil || !strings.Contains(err.Error(), "Go package") {
		t.Errorf("Go package on hosts: %v", err)
	}
}

func TestRdzvAddrFor(t *testing.T) {
	got, err := RdzvAddrFor([]Host{{"localhost", 1}, {"127.0.0.1", 2}})
	if err != nil || got != "127.0.0.1:0" {
		t.Errorf("loopback hosts: %q, %v", got, err)
	}
	// The route to a loopback address other than 127.0.0.1 leaves from
	// loopback too; user@ is not part of the address.
	got, err = RdzvAddrFor([]Host{{"localhost", 1}, {"me@127.0.0.2", 1}})
	if err != nil || got != "127.0.0.1:0" {
		t.Errorf("me@127.0.0.2: %q, %v", got, err)
	}
}

func FuzzParseHostfile(f *testing.F) {
	for _, s := range []string{"node1 slots=2\nnode2\n", "# c\n\n a slots=1 max_slots=3 # x\n", "a:2,b", "slots=2", "a slots=-1", "a,b:0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		check := func(what string, hosts []Host, err error) {
			if err != nil {
				if !strings.HasPrefix(err.Error(), "launch: ") {
					t.Fatalf("%s(%q): error without the package: %v", what, s, err)
				}
				return
			}
			seen := map[string]bool{}
			for _, h := range hosts {
				if h.Slots < 1 || checkHostName(h.Name) != nil || seen[h.Name] {
					t.Fatalf("%s(%q) = %v: bad host %+v", what, s, hosts, h)
				}
				seen[h.Name] = true
			}
		}
		hosts, err := ParseHostfile("f", strings.NewReader(s))
		check("ParseHostfile", hosts, err)
		if err == nil && len(hosts) == 0 {
			t.Fatalf("ParseHostfile(%q): no hosts and no error", s)
		}
		hosts, err = ParseHostList(s)
		check("ParseHostList", hosts, err)
	})
}
