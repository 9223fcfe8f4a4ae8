// Package rank is the rank's side of the launcher-to-rank contract: FromEnv reads
// the GEAR_* variables (or SLURM's, or none: a world of one), and Init joins the
// rendezvous and returns the World.
//
// A rank program, in order:
//
//  1. Calls Init(ctx). Under gearrun it connects to the job's coordinator
//     (GEAR_RDZV_ADDR), proves the job token without sending it (HMAC
//     challenge-response), registers its host identity, PID and any endpoints
//     (WithEndpoints), and returns once every rank has joined, with the table of
//     all ranks (Peers) and roles (Roles). A rank that never joins makes Init fail
//     on every rank with a *RendezvousError naming it. Alone, or with GEAR_WORLD_SIZE
//     of 1, Init contacts nothing and returns a world of one.
//  2. Uses the World: Rank, Size, LocalRank, LocalSize, NodeRank, Role, RoleRank,
//     Host; Barrier; the key-value exchange Set (write-once), Get and Wait, which
//     is how communicators trade addresses and the NCCL unique ID; OnLost, called
//     once for each rank that died, and Err. After a loss, Barrier and Wait fail
//     at once with a *LostError naming the rank.
//  3. Calls Close, which tells the coordinator that the rank leaves on purpose
//     (so it is not reported lost) and waits for the World's goroutines.
//
// The World implements collective.Bootstrap; communicators are built on it.
//
// The names of every variable the launcher sets are in env.go, and nowhere else.
// Shared-memory segments are named by SegmentName; a job is alive while its lock
// (LockJob, under RuntimeDir) is held. Coordinator is the rendezvous server the
// launcher runs (and rank 0 under SLURM without a launcher).
package rank
