// Package jobs decodes and validates TOML job specs, turns them into launch
// plans, and drives SLURM: batch scripts, submit, status, cancel and logs, with
// gear's records of submitted jobs in a state directory.
//
// # A program reading the spec it was launched with
//
//  1. Call FromEnv. gearrun passes the spec's path to every rank as
//     GEAR_JOB_SPEC; FromEnv returns ErrNoSpec when the program was started
//     some other way, so the program can fall back to its own flags.
//  2. Read what it needs: spec.Table (nil without a [table] section) holds the
//     replay table's columns, capacity per shard, trajectory length, sampler,
//     remover, rate limiter and max_times_sampled, with defaults filled in.
//
// # A tool loading a spec
//
//  1. Call Load(path) (or Parse(data, name)). It decodes in strict mode (an
//     unknown key is an error naming its line, column and key path), fills in
//     defaults (SetDefaults) and validates (Validate). Errors start with
//     "jobs: ", then the file and position where known, then the field path:
//     "jobs: job.toml: group[1].np: must be at least 1". Each validation
//     problem is a *FieldError; Validate reports all of them at once.
//  2. Inspect spec.Roles() and spec.WorldSize(): an SPMD spec has one role named
//     "", an MPMD spec one per [[group]], ranks numbered through the groups in
//     order.
//
// # Running a spec on this machine
//
//  1. Load the spec.
//  2. Call spec.Plan(ctx, path) for the launch plan (one launch group per role,
//     [launch].env and the groups' env, GEAR_JOB_SPEC, device binding from
//     gpus_per_rank and [gmi]); print it for --dry-run (Plan.WriteText).
//  3. Call launch.Run(ctx, plan, opts) with opts from spec.Options()
//     ([launch].timeout, grace, output_dir, tagged output) plus the caller's
//     streams and signals.
//
// # Submitting to SLURM
//
//  1. Make a Cluster: State from DefaultStateDir ($GEAR_STATE_DIR, else
//     $XDG_STATE_HOME/gear, else ~/.local/state/gear), Gearrun set to the
//     gearrun binary the compute nodes run (usually os.Executable()).
//  2. Call Submit(ctx, spec, specPath, workDir). It gives the job a gear job ID
//     (a UUID) and a secret token, writes the resolved spec and the batch
//     script (BatchScript) into the job's directory, runs sbatch with the token
//     in the batch environment (never in the script), and records SLURM's job
//     ID next to gear's.
//  3. Find jobs by either ID (StateDir.Find; a unique prefix of gear's ID of at
//     least 4 characters also works); call Status, Wait, Cancel and Logs.
//     Status asks squeue while the job is queued or running, then
//     `scontrol show job` (finished jobs stay there for SLURM's MinJobAge),
//     then sacct (which needs accounting), then the exit status the batch
//     script recorded in the job's directory, so COMPLETED, FAILED and
//     CANCELLED are told apart without slurmdbd.
//
// # Inside the allocation
//
// The batch script runs `gearrun run --slurm` on the first node, which is
// SlurmRun: it builds Go-package commands once, starts the rendezvous
// coordinator on the first node of SLURM_JOB_NODELIST at RendezvousPort(job
// ID) (the port rank.FromEnv derives too), and starts one srun step of
// `gearrun run --slurm-task`, one task per rank, with srun's
// --kill-on-bad-exit; the ranks dial the first node at its address
// (SlurmNodeAddr: SLURM's NodeAddr). Each task is a SlurmTask: it reads
// SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID and
// SLURM_JOB_NODELIST through rank.FromEnv, finds its role, sets the GEAR_*
// contract and the device binding, runs the role's command, and on failure
// prints gear's message naming the rank and its node and records it; SlurmRun
// reports the first failed rank (a rank killed by a signal before the peers
// that failed with it) as the job's cause and exits with its status. Once the
// coordinator has lost a rank, SlurmRun gives srun [launch].grace to end the
// step and then kills it: srun would wait minutes for the tasks of a node
// that died with its slurmd.
package jobs
