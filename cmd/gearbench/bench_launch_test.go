package main

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"
)

func TestBenchLaunchComparesCommands(t *testing.T) {
	var out strings.Builder
	if err := benchLaunch([]string{"-n", "3", "--json", "/bin/true", "--vs", "/bin/sh", "-c", "exit 0"}, &out); err != nil {
		t.Fatal(err)
	}
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want one per command:\n%s", len(lines), out.String())
	}
	if lines[0]["command"] != "/bin/true" || lines[1]["command"] != "/bin/sh -c exit 0" {
		t.Errorf("commands %v, %v", lines[0]["command"], lines[1]["command"])
	}
	for _, l := range lines {
		if w, _ := l["wall_ms"].(float64); w <= 0 {
			t.Errorf("%v: wall_ms %v, want > 0", l["command"], l["wall_ms"])
		}
		if l["runs"] != 3.0 {
			t.Errorf("%v: runs %v, want 3", l["command"], l["runs"])
		}
	}
	if r := lines[1]["wall_ratio"]; r != 1.0 {
		t.Errorf("the peer's own ratio is %v, want 1", r)
	}
}

func TestCommandLine(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want string
	}{
		{[]string{"/tmp/x1/gearrun", "-np", "4", "/bin/true"}, "gearrun -np 4 /bin/true"},
		{[]string{"sh", "-c", "/tmp/x1/gearrun -np 4 > /dev/null"}, "sh -c /tmp/x1/gearrun -np 4 > /dev/null"},
		{[]string{"/usr/bin/mpirun", "-np", "4", "/tmp/x1/hello"}, "/usr/bin/mpirun -np 4 hello"},
	} {
		if got := commandLine(c.in); got != c.want {
			t.Errorf("commandLine(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestBenchLaunchNamesAFailingCommand(t *testing.T) {
	var out strings.Builder
	err := benchLaunch([]string{"-n", "1", "/bin/sh", "-c", "echo broken >&2; exit 3"}, &out)
	if err == nil || !strings.Contains(err.Error(), "exit 3") || !strings.Contains(err.Error(), "broken") {
		t.Fatalf("err = %v, want the command, its status and its stderr", err)
	}
	if err := benchLaunch([]string{"/bin/true", "--vs"}, &out); err == nil {
		t.Fatal("an empty command after --vs was accepted")
	}
}
