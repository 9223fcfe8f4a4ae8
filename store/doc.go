// Package store implements a replay shard: column tables of fixed-size blocks in a
// shared-memory segment, its block allocator and status table, in-place writes with
// commit, and checkpoints.
//
// A shard holds up to Capacity trajectories. Each column (a field such as "obs",
// "action" or "reward") has its own table of Capacity blocks; a block holds one
// trajectory's field as Length frames of the column's shape, flattened and
// contiguous. Row i is the i-th block of every table. A committed row has a key, a
// priority, a times-sampled count, a commit time and an insertion sequence (its
// place in the shard's commit order, from 0); Ref{Index, Seq} names one committed
// occupant of a row and goes stale when that occupant is released or evicted.
//
// # The owner (one process per shard, usually the rank that trains)
//
//  1. Create(name, spec) makes the segment /dev/shm/<name> (mode 0600). name is a
//     whole segment name, such as rank.SegmentName(jobID, "store.0"); Create fails
//     if the segment exists.
//  2. Learn of new rows with ReadCommits(next, dst, max): the rows committed with
//     insertion sequence next onwards and still selectable, and the sequence to pass
//     next time. CommitSeq is a single atomic load for "anything new?"; Removals
//     likewise counts releases and evictions. If ReadCommits reports ErrMissed (the
//     reader fell a commit log behind, or the shard was restored), take
//     seq := CommitSeq(), walk Rows(), and go on from seq.
//  3. Select rows from its own index of them (package sample), read them with Read
//     or CopyBlock, and call SetPriority, MarkSampled and Release.
//  4. Call Reclaim(ctx) now and then (say once a second): it returns the rows of
//     writers that died between Allocate and Commit. A full shard's Allocate does
//     the same once per turnover of the shard.
//  5. Checkpoint(ctx, path) when wanted; Restore(ctx, path, name) makes a new shard
//     from a checkpoint; MergeCheckpoint and MergeFrom add a checkpoint's or a
//     shard's rows to a shard. WithProgress reports their progress (gearbench
//     draws it as a bar on a terminal). A restarted owner takes its shard over with Open (or
//     CreateOrOpen) once the previous owner is dead: every committed row stays,
//     and half-written rows and dead processes' pins are reclaimed.
//  6. Close() marks the shard closed and removes the segment. Processes still
//     attached keep their mapping, but their Allocate returns ErrClosed.
//
// # Writers (any process on the host, the owner included)
//
//  1. Attach(ctx, name, WithSpec(spec)) maps the segment. With WithSpec it fails
//     unless the shard has exactly that layout; the error names the column and both
//     shapes or types.
//  2. p, err := Allocate(ctx) takes a free row, or, when none is free, evicts the
//     committed row that the shard's Remover puts first (FIFO, LIFO, lowest
//     priority, or a custom one) and hands it over. It waits, until ctx is done,
//     only while every row is being written or pinned, or when the remover is
//     RemoverNone and nothing is free.
//  3. Write the row's blocks in place: p.Block(col) is the block as bytes;
//     Block[T](p, col) and Frame[T](p, col, t) are typed views that check the
//     element type; PutFrame and PutBlock copy data in and check type and shape.
//  4. p.Commit(priority) or p.CommitKey(key, priority) makes the row selectable; its
//     key defaults to its insertion sequence. p.Abort() gives the row back instead.
//  5. Close() when done. Close aborts this process's uncommitted rows.
//
// Allocate, Commit and Abort take no locks, make no system calls and allocate
// nothing (Commit reads the clock given by WithClock); they are a few atomic
// operations on the shared status table, the free queue and the commit log.
// Only a writer that finds no free row sleeps, on a futex in the segment that
// the next row given back to the free queue (Release, Abort) wakes; that
// wake is the one system call a release or abort may make.
//
// # Who may touch a block, and until when
//
//   - A Pending's blocks belong to the goroutine that called Allocate, from Allocate
//     until Commit or Abort. Nobody reads them before Commit. After Commit or Abort
//     the writer must not touch them: a later Allocate may hand the row to another
//     process.
//   - A committed row's blocks are read-only for everyone. A View's blocks stay put
//     (not evicted, not reused) from Read until View.Done, which must be called
//     exactly once. Without a View, read a committed row only through CopyBlock,
//     which copies and then checks that the row was not replaced meanwhile.
//   - Release on a pinned row makes it unselectable at once and frees it when its
//     last View is done.
//   - ColumnTable, BlockOffset and Mapping expose the page-aligned column tables
//     (for cuMemHostRegister); the same rules hold for device reads of those pages.
//   - Every View and Pending must be finished before the Shard handle is closed:
//     Close unmaps the blocks.
//
// # Crashes
//
// Every change to a row's state is one compare-and-swap on its status word, so a
// process that dies at any point leaves every row in a consistent state. A row whose
// writer died before committing is never selectable; Reclaim (or a full shard's
// Allocate) returns it to the free queue once the writer's process is gone, which it
// tells from the pid and start time in /proc (all processes attached to a shard
// must share a pid namespace). The free queue and the commit log survive a process
// that dies in the middle of an operation on them; the free queue is only a hint
// that a scan of the status table can rebuild. A checkpoint takes no pins, so a
// checkpointing process that dies leaves nothing behind but its temporary file,
// which the next checkpoint to that path removes. Views are pin counts, and each
// handle also notes the rows it holds Views of in a journal in the segment: Reclaim
// gives back the Views of a process that died (a released row is freed, the others
// can be evicted again). Only a process that dies in the instant between pinning a
// row and noting it (or between the two steps of Done), or that holds more than
// 512 Views at once through one handle (the rest are not noted), or whose handle
// is beyond the 63rd attached at once, leaves rows pinned until the shard is
// closed.
package store
