package rank

import (
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestTorchEnvOf(t *testing.T) {
	info := Info{Rank: 5, Size: 6, LocalRank: 1, LocalSize: 2, NodeRank: 2, NumNodes: 3, RoleRank: 5, JobID: "job-1"}
	te, err := TorchEnvOf(info, 6, "node1:29500")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"RANK=5", "WORLD_SIZE=6", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "GROUP_RANK=2", "GROUP_WORLD_SIZE=3",
		"ROLE_NAME=default", "ROLE_RANK=5", "ROLE_WORLD_SIZE=6", "MASTER_ADDR=node1", "MASTER_PORT=29500",
		"TORCHELASTIC_RESTART_COUNT=0", "TORCHELASTIC_MAX_RESTARTS=0", "TORCHELASTIC_RUN_ID=job-1"}
	if got := te.Environ(); !slices.Equal(got, want) {
		t.Errorf("Environ:\n got %q\nwant %q", got, want)
	}
	if got := te.Defaults(); !slices.Equal(got, []string{"OMP_NUM_THREADS=1"}) {
		t.Errorf("Defaults = %q", got)
	}
	te.LocalWorldSize = 1
	if got := te.Defaults(); got != nil {
		t.Errorf("a rank alone on its node: Defaults = %q", got)
	}
	v6, err := TorchEnvOf(info, 6, "[fd00::1]:29500")
	if err != nil || v6.MasterAddr != "fd00::1" {
		t.Errorf("IPv6 master: %+v, %v", v6, err)
	}
	for _, bad := range []string{"node1", "node1:0", "node1:http", "node1:70000"} {
		if _, err := TorchEnvOf(info, 6, bad); err == nil || !strings.Contains(err.Error(), "MASTER_") {
			t.Errorf("TorchEnvOf(%q): %v, want an error naming MASTER_ADDR/MASTER_PORT", bad, err)
		}
	}
}

// A reserved port is held (nobody else can listen on it) until release, and
// free for rank 0 to bind afterwards.
func TestReservePort(t *testing.T) {
	port, release, err := ReservePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		release()
		t.Fatalf("port %d could be bound while reserved", port)
	}
	release()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("port %d after release: %v", port, err)
	}
	ln.Close()
}
