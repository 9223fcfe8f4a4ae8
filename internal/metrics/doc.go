// Package metrics keeps the figures that gear's libraries count as a rank
// runs (collective calls, bytes and time; each replay table's size, inserts,
// samples and rate-limiter waits), in a small shared-memory segment per rank
// that other processes read without the rank's help: `gearrun top`, the
// Prometheus text that `gearrun --metrics-addr` serves, and the trace that
// `gearrun --trace` writes when the job ends.
//
// What a rank does, in order:
//
//  1. Open makes the rank's segment (rank.Init does it for every rank that
//     gearrun or SLURM started; a program alone has none), and Publish makes
//     it the process's current segment, which the hooks find with Current.
//  2. The hooks count: collective's public calls through Comm.Start (each
//     communicator keeps a Comm) and Call.End, sample's tables through
//     Rank.Table and the *Table methods. With no segment published every
//     hook is a nil check; with one, a collective call updates its
//     communicator's counters, which have one writer (the communicator's
//     calls, one at a time), with plain loads and stores: no locked
//     instruction. One call in 256 of each operation on each communicator is
//     timed (Snapshot scales the time to every call). A rank's first
//     maxComms communicators get their own counters, later ones share the
//     rank's (atomic adds). A table's counters are plain stores made under
//     the table's own lock.
//  3. With a trace (Open's traceEvents > 0), every hooked call also leaves an
//     event in a ring of the last traceEvents events; WriteTrace merges the
//     rings of a job's ranks into one Chrome trace-event file.
//  4. Close stamps the segment's end; the segment stays for the
//     launcher (per job: shmname.Metrics) until the job ends; Remove also
//     unlinks it.
//
// Readers: Read maps one segment read-only and returns its Snapshot; Job
// reads every segment of a job; JobIDs lists the jobs that have segments.
package metrics
