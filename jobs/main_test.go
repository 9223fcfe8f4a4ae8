package jobs

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"github.com/gear-rl/gear/internal/statehome"
	"github.com/gear-rl/gear/rank"
)

// The test binary doubles as the programs the SLURM-mode tests start:
//
//	envTestTask=1: `gearrun run --slurm-task`: args are [--job-dir DIR] SPEC.
//	envTestRank=1: a rank that joins the world, passes a barrier and prints
//	               its place.
const (
	envTestTask = "GEAR_JOBS_TEST_TASK"
	envTestRank = "GEAR_JOBS_TEST_RANK"
)

func TestMain(m *testing.M) {
	switch {
	case os.Getenv(envTestTask) == "1":
		os.Exit(testTaskMain(os.Args[1:]))
	case os.Getenv(envTestRank) == "1":
		os.Exit(testRankMain())
	}
	removeState := statehome.Private()
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		removeState()
		gearrunCmds.Remove()
		multinodeCmds.Remove()
		os.Exit(code)
	}))
}

func testTaskMain(args []string) int {
	var jobDir string
	if len(args) >= 2 && args[0] == "--job-dir" {
		jobDir, args = args[1], args[2:]
	}
	if len(args) != 1 {
		fmt.Fprintf(os.Stderr, "test task: want [--job-dir DIR] SPEC, got %q\n", args)
		return 2
	}
	spec, err := Load(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	t := &SlurmTask{Spec: spec, SpecPath: args[0], JobDir: jobDir, Stdout: os.Stdout, Stderr: os.Stderr}
	code, err := t.Run(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func testRankMain() int {
	ctx := context.Background()
	w, err := rank.Init(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rank:", err)
		return 1
	}
	defer w.Close()
	if err := w.Barrier(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "barrier:", err)
		return 1
	}
	spec, err := FromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "spec:", err)
		return 1
	}
	fmt.Printf("rank %d/%d role %q %d/%d spec %s job %s\n", w.Rank(), w.Size(), w.Role(), w.RoleRank(), w.RoleSize(), spec.Name, w.JobID())
	return 0
}
