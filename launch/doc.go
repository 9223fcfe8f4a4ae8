// Package launch turns a launch request into a plan (plain data that --dry-run
// prints), spawns one process per rank with the rank contract in its environment,
// binds devices, tags and routes output, fails fast and forwards signals.
//
// A caller, in order:
//
//  1. Describes the job as a Request: one Group per MPMD group (-np, program,
//     role, environment), and job-wide settings (rendezvous address and timeout,
//     -x environment, working directory). A group's Bind request (a
//     gmi.PlanRequest), with the machine in Request.Topology (gmi.Discover),
//     binds its ranks to GPUs as gmi.NewPlan places them: CUDA_VISIBLE_DEVICES
//     as a GPU index or MIG UUID, MPS shares, GEAR_GMI_LAYOUT (BindGPUs, which
//     the SLURM path of package jobs calls too). A Binder, if given, chooses
//     the device of the other ranks; BinderFunc adapts a function.
//  2. Calls NewPlan. The Plan is plain data: it can be printed (WriteText,
//     WriteJSON, with the token masked), inspected, edited or built by other
//     packages (jobs turns a TOML job spec into one) before it runs.
//  3. Calls Run with Options (output tagging or an output directory, stdin, a
//     timeout, the grace period, a channel of signals to forward). Run takes the
//     job's lock, builds Go package programs once, runs the rendezvous
//     coordinator (rank.Coordinator, on loopback by default), starts every rank in
//     its own process group with a parent-death signal, and waits. It returns a
//     Result, and a *JobError whose Code is the launcher's exit code unless every
//     rank exited 0.
//
// Failure behaviour: the first rank to exit non-zero (or die of a signal) ends
// the job: Run prints one line naming it ("gearrun: rank 2 (pid 4242) exited with
// status 3"), tells the coordinator (so that its peers' collectives fail at once,
// naming the lost rank), sends SIGTERM to every rank's process group and SIGKILL
// after Options.Grace. The exit code is the rank's code, or 128+signal. A world
// that does not assemble (a rank never joins within the rendezvous timeout, or
// ends first) fails the job with ExitLaunchFailed; Options.Timeout with
// ExitTimeout. When the job ends, whatever is left in the ranks' process groups is
// killed, output is drained for Options.Drain at most (a grandchild that keeps a
// pipe open never holds the launcher), and the job's shared-memory segments
// (rank.SegmentName(jobID, ...)) and lock file are removed. If the launcher itself
// is killed with SIGKILL, the ranks die of their parent-death signal and a small
// guard process kills their process groups and removes the segments.
//
// Restarts: with Plan.MaxRestarts N, a rank's failure does not end the job;
// Run stops the world as above, prints "gearrun: restart 1 of N: <the
// failure>" (RestartLine) and starts it again as the next generation
// (Plan.Restart, told to the ranks as GEAR_RESTART_COUNT; a coordinator of
// generation n refuses the ranks of any other one), up to N times. The lock,
// the guard and the job's segments are kept from one generation to the next;
// the checkpoint directory (Plan.CheckpointDir, GEAR_CHECKPOINT_DIR) is never
// removed. A signal, the timeout or a world that does not assemble ends the
// job at once, even while the world stops after a rank's failure. Run,
// RunOnHosts and the SLURM batch side (package jobs) share one RestartLoop.
//
// Clean removes the segments of jobs that are gone (gearrun clean).
//
// # Ranks from a test binary
//
// Multi-process tests run their own test binary as the ranks: the plan's program
// is os.Args[0] with -test.run selecting one test, and an environment variable
// tells the copy that it is a rank. Package launchtest packages this:
//
//	func TestAllReduce(t *testing.T) {
//		launchtest.RunRanks(t, 4, func(t *testing.T, w *rank.World) {
//			// in each of 4 processes: build a communicator on w, check results
//		})
//	}
//
// A package that prefers TestMain can do the same by hand: build a Plan whose
// Argv is os.Args[0] plus -test.run, with an -x variable of its own, Run it, and
// in TestMain let a process that sees the variable act as a rank (rank.Init, work,
// os.Exit with its status) instead of calling m.Run.
package launch
