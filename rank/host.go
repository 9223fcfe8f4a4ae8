package rank

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
)

// HostID returns this process's host identity: ranks with equal host identity
// share /dev/shm and may talk through shared memory. It is GEAR_HOST_ID when set,
// else "<hostname>/<hash>" where the hash covers the kernel's boot ID and the
// network namespace, so that ranks in different network namespaces (containers,
// test sandboxes) count as different hosts even on one machine.
func HostID() string {
	if id := os.Getenv(EnvHostID); id != "" {
		return id
	}
	return deriveHostID(os.Hostname, os.ReadFile, os.Readlink)
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
