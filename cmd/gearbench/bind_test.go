package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestBindToCoreKeepsGOMAXPROCS: a rank pinned to one CPU keeps its Ps. The Go
// runtime follows the process's CPU mask about once a second (from sysmon,
// awake while a goroutine runs) and would drop GOMAXPROCS to 1. The pinning
// runs in a child process, which it would otherwise leave pinned.
func TestBindToCoreKeepsGOMAXPROCS(t *testing.T) {
	if os.Getenv("GEAR_TEST_BIND_CHILD") == "1" {
		// The testing package sets GOMAXPROCS (-test.cpu), which stops the
		// updates; a program's main has them.
		runtime.SetDefaultGOMAXPROCS()
		before := runtime.GOMAXPROCS(0)
		if err := bindToCore(0); err != nil {
			fmt.Println("bind:", err)
			os.Exit(1)
		}
		for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); {
		}
		fmt.Printf("GOMAXPROCS %d -> %d\n", before, runtime.GOMAXPROCS(0))
		os.Exit(0)
	}
	if runtime.NumCPU() < 2 || os.Getenv("GOMAXPROCS") != "" {
		t.Skip("needs 2 CPUs and GOMAXPROCS unset: the runtime would have nothing to change")
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestBindToCoreKeepsGOMAXPROCS$")
	cmd.Env = append(os.Environ(), "GEAR_TEST_BIND_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var before, after int
	line := strings.TrimSpace(string(out))
	if _, err := fmt.Sscanf(line, "GOMAXPROCS %d -> %d", &before, &after); err != nil {
		t.Fatalf("child printed %q: %v", line, err)
	}
	if before < 2 || after != before {
		t.Fatalf("GOMAXPROCS %d before pinning, %d after", before, after)
	}
}
