package rank

import (
	"strconv"
	"strings"
)

// The launcher-to-rank contract has one encoder, Info.Environ, and one decoder,
// FromLookup (FromEnv). A launcher (gearrun's local and host launches, the SLURM
// task wrapper) builds the Info of each rank, sets Info.Environ in its
// environment with MergeEnv, and adds the per-rank extras that are not facts of
// the Info (GEAR_NODE_NAME, GEAR_JOB_SPEC, the device binding). A job spec may
// set none of LauncherEnv's names: they are the launcher's.

// ContractEnv returns the names of the variables that Info.Environ sets, in
// the order it sets them: one per fact of an Info. A rank never inherits any of
// them from its launcher's environment (MergeEnv drops them), so that a nested
// launch never leaks its parent's place. The slice is the caller's.
func ContractEnv() []string {
	return []string{
		EnvRank, EnvWorldSize, EnvLocalRank, EnvLocalSize, EnvNodeRank, EnvNumNodes,
		EnvRole, EnvRoleRank, EnvRdzvAddr, EnvRdzvTimeout, EnvJobID, EnvJobToken,
		EnvRestartCount, EnvCheckpointDir, EnvHeartbeatInterval, EnvHeartbeatTimeout,
	}
}

// DeviceEnv returns the names of the variables of a rank's device binding
// (gearrun --bind gpu or --gmi-per-gpu, a job spec's gpus_per_rank): set for a
// rank that the launcher binds, and then never inherited from the launcher.
// The slice is the caller's.
func DeviceEnv() []string {
	return []string{EnvCUDAVisibleDevices, EnvCUDADeviceOrder, EnvMPSThreadPercent,
		EnvMPSPinnedMemLimit, EnvGMILayout}
}

// LauncherEnv returns the names of every variable a launcher sets per rank:
// the contract (ContractEnv), the rank's node name as a host list gave it
// (EnvNodeName), the job spec's path (EnvJobSpec) and the device binding
// (DeviceEnv). A job spec's env may set none of them (jobs refuses it). Not
// among them: torchrun's variables (TorchEnv), which a rank's env may
// override. The slice is the caller's.
func LauncherEnv() []string {
	env := append(ContractEnv(), EnvNodeName, EnvJobSpec)
	return append(env, DeviceEnv()...)
}

// Environ encodes i as the contract's variables ("NAME=value" entries, in the
// order of ContractEnv), what FromLookup reads back as i with Source
// SourceGear: every fact of i but Source and ServeRdzv, which are the
// decoder's. GEAR_RDZV_TIMEOUT is left out while RdzvTimeout is not positive
// (the rank takes DefaultRdzvTimeout), GEAR_CHECKPOINT_DIR while CheckpointDir
// is "", GEAR_HEARTBEAT_INTERVAL and GEAR_HEARTBEAT_TIMEOUT while
// HeartbeatInterval and HeartbeatTimeout are not positive (the defaults). The entries hold the token: never print them.
func (i Info) Environ() []string {
	itoa := strconv.Itoa
	env := []string{
		EnvRank + "=" + itoa(i.Rank),
		EnvWorldSize + "=" + itoa(i.Size),
		EnvLocalRank + "=" + itoa(i.LocalRank),
		EnvLocalSize + "=" + itoa(i.LocalSize),
		EnvNodeRank + "=" + itoa(i.NodeRank),
		EnvNumNodes + "=" + itoa(i.NumNodes),
		EnvRole + "=" + i.Role,
		EnvRoleRank + "=" + itoa(i.RoleRank),
		EnvRdzvAddr + "=" + i.RdzvAddr,
	}
	if i.RdzvTimeout > 0 {
		env = append(env, EnvRdzvTimeout+"="+i.RdzvTimeout.String())
	}
	env = append(env,
		EnvJobID+"="+i.JobID,
		EnvJobToken+"="+i.Token,
		EnvRestartCount+"="+itoa(i.Restart))
	if i.CheckpointDir != "" {
		env = append(env, EnvCheckpointDir+"="+i.CheckpointDir)
	}
	if i.HeartbeatInterval > 0 {
		env = append(env, EnvHeartbeatInterval+"="+i.HeartbeatInterval.String())
	}
	if i.HeartbeatTimeout > 0 {
		env = append(env, EnvHeartbeatTimeout+"="+i.HeartbeatTimeout.String())
	}
	return env
}

// EnvValue is the value of name in env (KEY=VALUE entries), the last
// entry winning as in MergeEnv; "" when env has none.
func EnvValue(env []string, name string) string {
	v := ""
	for _, kv := range env {
		if s, ok := strings.CutPrefix(kv, name+"="); ok {
			v = s
		}
	}
	return v
}

// MergeEnv returns the environment of a rank that inherits base ("NAME=value"
// entries, as os.Environ gives them) and is given add: base less every
// contract variable (ContractEnv: a rank never inherits its launcher's place)
// and GEAR_GMI_LAYOUT (the GMI layout of the launcher's own world), less the
// names in drop, then each entry of add, which replaces the entry
// of the same name where it stands or else is appended. Of several entries of
// one name the last wins, so a caller lists add from the lowest precedence to
// the highest, and puts defaults that the inherited values override at the
// front of base. MergeEnv modifies neither slice.
func MergeEnv(base, add []string, drop ...string) []string {
	skip := make(map[string]bool, len(drop)+17)
	for _, name := range append(ContractEnv(), EnvGMILayout) {
		skip[name] = true
	}
	for _, name := range drop {
		skip[name] = true
	}
	index := make(map[string]int, len(base)+len(add))
	out := make([]string, 0, len(base)+len(add))
	put := func(kv string) {
		name, _, _ := strings.Cut(kv, "=")
		if i, ok := index[name]; ok {
			out[i] = kv
			return
		}
		index[name] = len(out)
		out = append(out, kv)
	}
	for _, kv := range base {
		if name, _, _ := strings.Cut(kv, "="); !skip[name] {
			put(kv)
		}
	}
	for _, kv := range add {
		put(kv)
	}
	return out
}
