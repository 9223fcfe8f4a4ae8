package rank

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
)

// HostID returns this process's host identity: ranks with equal host identity
// share /dev/shm and may talk through shared memory. It is GEAR_HOST_ID when set,
// else "<node>/<hash>" where the hash covers the kernel's boot ID and the
// network namespace, so that ranks in different network namespaces (containers,
// test sandboxes) count as different hosts even on one machine. The node is
// NodeName's.
func HostID() string {
	if id := os.Getenv(EnvHostID); id != "" {
		return id
	}
	return deriveHostID(func() (string, error) { return NodeName(), nil }, os.ReadFile, os.Readlink)
}

// NodeName is the name of this process's node, as messages about lost hosts
// give it: GEAR_NODE_NAME (what -H or a hostfile called the host), else
// SLURMD_NODENAME (the SLURM node), else the host name.
func NodeName() string {
	for _, v := range []string{EnvNodeName, EnvSlurmdNodeName} {
		if name := os.Getenv(v); name != "" {
			return name
		}
	}
	name, _ := os.Hostname()
	return name
}

// HostName returns the node part of a host identity made by HostID
// ("n2/3fa9c1..." -> "n2"); an identity set by GEAR_HOST_ID is returned whole.
func HostName(hostID string) string {
	if i := strings.LastIndexByte(hostID, '/'); i > 0 {
		return hostID[:i]
	}
	return hostID
}

func deriveHostID(hostname func() (string, error), readFile func(string) ([]byte, error), readlink func(string) (string, error)) string {
	name, err := hostname()
	if err != nil || name == "" {
		name = "localhost"
	}
	h := sha256.New()
	if boot, err := readFile("/proc/sys/kernel/random/boot_id"); err == nil {
		h.Write([]byte(strings.TrimSpace(string(boot))))
	}
	h.Write([]byte{0})
	if ns, err := readlink("/proc/self/ns/net"); err == nil {
		h.Write([]byte(ns))
	}
	return name + "/" + hex.EncodeToString(h.Sum(nil)[:6])
}
