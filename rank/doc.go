// Package rank is the rank's side of the launcher-to-rank contract: FromEnv reads
// the GEAR_* variables (or SLURM's, or none: a world of one), and Init joins the
// rendezvous and returns the World with its communicators.
package rank
