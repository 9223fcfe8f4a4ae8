package rank

import (
	"strings"
	"testing"
	"time"
)

// The heartbeat settings travel from the launcher to the rank through the
// contract, and bad ones are refused by name.
func TestHeartbeatSettings(t *testing.T) {
	in := Info{Rank: 1, Size: 2, LocalSize: 2, NumNodes: 1, RdzvAddr: "127.0.0.1:1", JobID: "j",
		HeartbeatInterval: 400 * time.Millisecond, HeartbeatTimeout: 3 * time.Second}
	env := map[string]string{}
	for _, kv := range in.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	if env[EnvHeartbeatInterval] != "400ms" || env[EnvHeartbeatTimeout] != "3s" {
		t.Fatalf("environ: %s=%q %s=%q", EnvHeartbeatInterval, env[EnvHeartbeatInterval], EnvHeartbeatTimeout, env[EnvHeartbeatTimeout])
	}
	out, err := FromLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	if out.HeartbeatInterval != in.HeartbeatInterval || out.HeartbeatTimeout != in.HeartbeatTimeout {
		t.Fatalf("read back %v, %v", out.HeartbeatInterval, out.HeartbeatTimeout)
	}
	env[EnvHeartbeatTimeout] = "500ms" // under twice 400ms
	if _, err := FromLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("timeout under twice the interval: %v", err)
	}
	env[EnvHeartbeatTimeout] = "soon"
	if _, err := FromLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err == nil || !strings.Contains(err.Error(), EnvHeartbeatTimeout) {
		t.Fatalf("malformed timeout: %v", err)
	}
	if err := CheckHeartbeat(0, 0); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if got := DetectionTime(0, 0); got != DefaultHeartbeat+DefaultHeartbeatTimeout {
		t.Fatalf("DetectionTime of the defaults %v", got)
	}
	if _, err := NewCoordinator(CoordinatorConfig{Size: 1, Heartbeat: time.Second, HeartbeatTimeout: time.Second}); err == nil {
		t.Fatal("a coordinator with a timeout under twice the interval started")
	}
}
