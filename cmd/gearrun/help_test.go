package main

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/gear-rl/gear/rank"
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

// --dry-run --json says, as the text form does, which values are chosen when
// the job starts: the rendezvous port of 127.0.0.1:0 and MASTER_PORT.
func TestDryRunJSONSaysWhatIsChosenAtLaunch(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--dry-run", "--json", "-np", "2", "/bin/true"}, []string{rank.EnvRdzvAddr, rank.EnvTorchMasterPort}},
		{[]string{"--dry-run", "--json", "--rdzv-addr", "127.0.0.1:29400", "-np", "2", "/bin/true"}, []string{rank.EnvTorchMasterPort}},
		{[]string{"--dry-run", "--json", "--rdzv-addr", "127.0.0.1:29400", "--torch-env=false", "-np", "2", "/bin/true"}, nil},
	} {
		code, out, errs := gearrunIn(c.args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", c.args, code, errs)
		}
		var plan struct {
			ChosenAtLaunch map[string]string `json:"chosen_at_launch"`
		}
		if err := json.Unmarshal([]byte(out), &plan); err != nil {
			t.Fatalf("%v: %v\n%s", c.args, err, out)
		}
		got := slices.Sorted(maps.Keys(plan.ChosenAtLaunch))
		if !slices.Equal(got, c.want) {
			t.Errorf("%v: chosen_at_launch names %q, want %q", c.args, got, c.want)
		}
		for k, v := range plan.ChosenAtLaunch {
			if !strings.Contains(v, "at launch") {
				t.Errorf("%v: chosen_at_launch[%s] = %q does not say it is chosen at launch", c.args, k, v)
			}
		}
	}
}
