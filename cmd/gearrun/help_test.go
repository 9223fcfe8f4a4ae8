package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestHelpListsLaunchFlags: gearrun -h, --help and help print the launch flags
// as mpirun -h does, --version among them, and the subcommands after them; a
// launch's -h prints the same.
func TestHelpListsLaunchFlags(t *testing.T) {
	var want string
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}, {"-np", "1", "-h"}} {
		var out, errb bytes.Buffer
		code := run(args, stdio{strings.NewReader(""), &out, &errb})
		if code != 0 {
			t.Fatalf("%v: exit %d (stderr %q)", args, code, errb.String())
		}
		text := out.String() + errb.String()
		flags := strings.Index(text, "Launch flags:")
		cmds := strings.Index(text, "Commands")
		if flags < 0 || cmds < flags {
			t.Fatalf("%v: want the launch flags, then the commands:\n%s", args, text)
		}
		for _, f := range []string{"-np N", "-max-restarts N", "-checkpoint-dir DIR", "-output-dir DIR", "-x NAME=VALUE", "-dry-run", "-json", "-version", "-help"} {
			if i := strings.Index(text, "\n  "+f); i < flags || i > cmds {
				t.Errorf("%v: flag %q is not among the launch flags", args, f)
			}
		}
		for _, c := range commands {
			if !strings.Contains(text[cmds:], "\n  "+c.name+" ") {
				t.Errorf("%v: command %q is not listed after the flags", args, c.name)
			}
		}
		if want == "" {
			want = text
		} else if text != want {
			t.Errorf("%v printed another help than %v", args, []string{"-h"})
		}
	}
}
