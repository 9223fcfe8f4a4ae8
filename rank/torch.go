package rank

import (
	"fmt"
	"net"
	"strconv"
)

// TorchEnv is one rank's place in torchrun's terms: what the launcher sets, as
// the EnvTorch* variables, so that a PyTorch program calls
// torch.distributed.init_process_group() with its default env:// init, as it
// would under torchrun.
type TorchEnv struct {
	Rank, WorldSize           int
	LocalRank, LocalWorldSize int
	// GroupRank and GroupWorldSize are the node's index and the number of
	// nodes: torchrun runs one agent, leading one worker group, per node.
	GroupRank, GroupWorldSize int
	// RoleName is the rank's MPMD role; "" becomes "default", torchrun's name
	// for its one role.
	RoleName                string
	RoleRank, RoleWorldSize int
	// MasterAddr and MasterPort are where rank 0 serves torch's TCPStore.
	MasterAddr string
	MasterPort int
	// RestartCount and MaxRestarts are the job's restarts so far and its
	// budget.
	RestartCount, MaxRestarts int
	// RunID is the job's ID.
	RunID string
}

// TorchEnvOf fills a TorchEnv from a rank's Info, the size of its role and
// the TCPStore's address ("host:port").
func TorchEnvOf(info Info, roleSize int, master string) (TorchEnv, error) {
	t := TorchEnv{
		Rank: info.Rank, WorldSize: info.Size,
		LocalRank: info.LocalRank, LocalWorldSize: info.LocalSize,
		GroupRank: info.NodeRank, GroupWorldSize: info.NumNodes,
		RoleName: info.Role, RoleRank: info.RoleRank, RoleWorldSize: roleSize,
		RunID: info.JobID,
	}
	host, port, err := net.SplitHostPort(master)
	if err != nil {
		return TorchEnv{}, fmt.Errorf("rank: %s/%s %q: %w", EnvTorchMasterAddr, EnvTorchMasterPort, master, err)
	}
	t.MasterAddr = host
	if t.MasterPort, err = strconv.Atoi(port); err != nil || t.MasterPort < 1 || t.MasterPort > 65535 {
		return TorchEnv{}, fmt.Errorf("rank: %s %q: want a port from 1 to 65535", EnvTorchMasterPort, port)
	}
	return t, nil
}

// Environ returns the variables as "NAME=value" entries, in the order of the
// EnvTorch* constants. MASTER_PORT is left out while MasterPort is 0.
func (t TorchEnv) Environ() []string {
	role := t.RoleName
	if role == "" {
		role = "default"
	}
	itoa := strconv.Itoa
	env := []string{
		EnvTorchRank + "=" + itoa(t.Rank),
		EnvTorchWorldSize + "=" + itoa(t.WorldSize),
		EnvTorchLocalRank + "=" + itoa(t.LocalRank),
		EnvTorchLocalWorldSize + "=" + itoa(t.LocalWorldSize),
		EnvTorchGroupRank + "=" + itoa(t.GroupRank),
		EnvTorchGroupWorldSize + "=" + itoa(t.GroupWorldSize),
		EnvTorchRoleName + "=" + role,
		EnvTorchRoleRank + "=" + itoa(t.RoleRank),
		EnvTorchRoleWorldSize + "=" + itoa(t.RoleWorldSize),
		EnvTorchMasterAddr + "=" + t.MasterAddr,
	}
	if t.MasterPort > 0 {
		env = append(env, EnvTorchMasterPort+"="+itoa(t.MasterPort))
	}
	return append(env,
		EnvTorchRestartCount+"="+itoa(t.RestartCount),
		EnvTorchMaxRestarts+"="+itoa(t.MaxRestarts),
		EnvTorchRunID+"="+t.RunID)
}

// Defaults returns what a rank gets only where its own environment has no
// value: OMP_NUM_THREADS=1 when it shares its node with other ranks, as
// torchrun sets it.
func (t TorchEnv) Defaults() []string {
	if t.LocalWorldSize > 1 {
		return []string{EnvOMPNumThreads + "=1"}
	}
	return nil
}

// ReservePort finds a free TCP port on host ("" for every interface) and
// holds it until release is called: a launcher reserves the TCPStore's port
// this way and releases it just before rank 0 starts and binds it.
func ReservePort(host string) (port int, release func(), err error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, nil, fmt.Errorf("rank: reserving a port for %s: %w", EnvTorchMasterPort, err)
	}
	return ln.Addr().(*net.TCPAddr).Port, func() { ln.Close() }, nil
}
