// Package store implements a replay shard: column tables of fixed-size blocks in a
// shared-memory segment, its block allocator and status table, in-place writes with
// commit, and checkpoints.
package store
