// Package sample implements Reverb's selectors and rate limiters, the replay table
// over GEAR shards, distributed selection and collection.
//
// # Selectors and rate limiters
//
// A Selector keeps its own index of a table's items, addressed by slot (a small
// integer the table assigns; in a shard-backed table, the row), and chooses among
// them: NewUniform, NewPrioritized(c) (P(i) = p_i^c / sum_k p_k^c, with the
// probability returned with each pick), NewFIFO, NewLIFO, NewMaxHeap, NewMinHeap
// (ties go to the item least recently inserted or updated). Every selector can be a
// table's sampler or its remover. Randomness comes only from the *rand.Rand passed
// to Sample, so a seed fixes every choice. RateLimit holds Reverb's four parameters
// and RateLimiter its exact arithmetic; MinSize, SampleToInsertRatio, Queue and
// Stack are Reverb's presets.
//
// # A table in one process, in order
//
//  1. NewTable(Config{Name, MaxSize, Sampler, Remover, MaxTimesSampled, RateLimit,
//     Seed}) with two fresh selectors; the table owns them from then on.
//  2. Insert(ctx, key, priority, ref) from any goroutine. It waits while the rate
//     limiter refuses inserts; an existing key only has its priority set. ref is an
//     opaque reference to the item's data, which the table never reads.
//  3. Sample(ctx, n) or SampleInto(ctx, dst) from any goroutine: a flexible batch of
//     1 to n items. It waits for the first item only; a context that ends before
//     that is an error, a partial batch is not.
//  4. MutatePriorities(updates, deletes) as training computes new priorities.
//  5. Info for counts and limiter state; Reset to empty the table.
//  6. Close, once: it wakes every waiting call with ErrClosed.
//
// # A table over a store shard, in order
//
//  1. Create the shard with Remover "none" (the table decides evictions), then
//     NewShardTable(shard, cfg). Close the table before the shard.
//  2. Writers, in any process on the host, Allocate, fill the blocks in place and
//     CommitKey(key, priority); the table admits commits in order, waiting on its
//     rate limiter. ShardTable.Insert does the three steps in this process and waits
//     for the admission.
//  3. Sample(ctx, n) returns a *Batch; Collect(ctx, indices, columns, window) copies
//     the rows (Item.Index) into one contiguous buffer per column.
//  4. Batch.Release once the batch is collected.
//
// # A table over the ranks of a communicator, in order
//
//  1. On every rank, build the local shard (a Table or a ShardTable of the same
//     configuration) and call NewDistTable(ctx, comm, local, opts...), which is
//     collective. Give the table a communicator of its own.
//  2. Insert locally, as above.
//  3. On every rank, in the same order, from one goroutine: Sample(ctx, n), Top(ctx,
//     k), Collect(ctx, indices, columns, window), Sync(ctx). Sampled items carry
//     global indices: shard*Capacity() + row.
//  4. Batch.Release on every rank after the Collect calls that read the batch.
//  5. Close on every rank, then the local tables.
//
// # On the GPU, in order
//
//  1. OpenDevice(ordinal) (or a *cuda.Device of the caller's); without a driver its
//     error wraps cuda.ErrNoDriver, and the host paths need none.
//  2. ShardTable.RegisterDevice(ctx, dev) pins and maps the shard's column tables once.
//     In a distributed table, pass WithNCCL(nc) to NewDistTable, nc being an NCCL
//     communicator on dev whose ranks are the table's.
//  3. ItemBytes(columns, w) sizes the device buffers; CollectDevice(ctx, stream,
//     dst, indices, columns, w) (collective on a DistTable) fills them as
//     Collect fills host buffers, and returns once they hold the items.
//  4. For selection on the GPU, NewDeviceSelection(dev) (or NewTwinSelection for
//     the CPU twins, which pick the same) in Config.Selection.
//  5. Close the tables (which unregisters the device), then the selection, the
//     NCCL communicator and the device, then the shards.
//
// # Buffer ownership
//
// A Sampled batch (a slice, or a Batch's Items) is the caller's: the tables keep no
// reference to it, and SampleInto writes only into what it is given. Collect's
// buffers are the caller's; CollectInto reuses those it is given. A table never
// touches the data an Item's Ref names; Config.OnDelete tells when an item leaves.
//
// Device buffers: CollectDevice's dst is the caller's; the collection writes it
// only from the stream it is given, and not after the call returns, except that
// a call whose context ended while the device worked leaves the kernel writing
// it until the stream passes that work (and the rows it reads pinned until the
// next device collection or UnregisterDevice). The registered column tables are
// the shard's; a DeviceSelection's mirrors and a registration's staging buffers
// are theirs alone.
//
// Shard rows: a row sampled and not deleted stays valid while its item is in the
// table. A row that the sample itself deleted (max_times_sampled) stays pinned in
// the shard, readable by Collect, until the Batch that sampled it is released; in a
// distributed table its owner's Batch holds it. A row deleted otherwise (the remover
// on overflow, MutatePriorities, Reset) may be reused by a writer at once and can no
// longer be collected. Writers own a row's blocks from Allocate to Commit only.
package sample
