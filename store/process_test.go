package store_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// soakTime is how long the soak test's writers run: 10s, 2s with -short, or
// STORETEST_SOAK (a Go duration).
func soakTime() time.Duration {
	if v := os.Getenv("STORETEST_SOAK"); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	if testing.Short() {
		return 2 * time.Second
	}
	return 10 * time.Second
}

// TestSoakTwoWritersOneReader runs two writer processes against this process's
// reader. The shard has no remover, so writers wait for free rows and the reader,
// which releases every row after checking it, must read back every row committed:
// each writer's payloads 0..n-1, each exactly once, every byte as written.
func TestSoakTwoWritersOneReader(t *testing.T) {
	spec := storetest.Spec(256)
	spec.Remover = store.RemoverNone
	s := storetest.Create(t, spec)
	d := soakTime()
	writers := []*child{
		startChild(t, "writer", s.Name(), "1 "+d.String()),
		startChild(t, "writer", s.Name(), "2 "+d.String()),
	}
	counts := make(chan [2]int, 2)
	for i, w := range writers {
		go func() {
			line, err := w.out.ReadString('\n')
			n, perr := strconv.Atoi(trim(line))
			if err != nil || perr != nil {
				n = -1
			}
			counts <- [2]int{i + 1, n}
		}()
	}

	seen := map[int][]bool{1: nil, 2: nil}
	var held []store.View // rows kept pinned a while, some released meanwhile
	var rows []store.RowStatus
	var next uint64
	verified, doomed, resyncs := 0, 0, 0
	check := func(v store.View, key uint64) {
		id, err := storetest.Check(storetest.Blocks(v))
		if err != nil {
			t.Fatalf("row %v: %v", v.Ref(), err)
		}
		if id != key {
			t.Fatalf("row %v: payload %d under key %d", v.Ref(), id, key)
		}
		w, n := int(id>>40), int(id&(1<<40-1))
		if w != 1 && w != 2 {
			t.Fatalf("row %v: payload of writer %d", v.Ref(), w)
		}
		for len(seen[w]) <= n {
			seen[w] = append(seen[w], false)
		}
		if seen[w][n] {
			t.Fatalf("payload %d of writer %d read twice", n, w)
		}
		seen[w][n] = true
		verified++
	}
	consume := func(st store.RowStatus) {
		v, err := s.Read(st.Ref())
		if err != nil {
			t.Fatalf("read %v: %v", st.Ref(), err)
		}
		check(v, st.Key)
		if verified%5 == 0 {
			if _, err := s.MarkSampled(st.Ref()); err != nil {
				t.Fatal(err)
			}
			if err := s.SetPriority(st.Ref(), 0.5); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Release(st.Ref()); err != nil {
			t.Fatal(err)
		}
		if verified%7 == 0 && len(held) < 16 {
			held = append(held, v) // released while pinned: freed when done
			doomed++
			return
		}
		v.Done()
	}
	done := 0
	got := map[int]int{}
	ctx := context.Background()
	for done < 2 {
		select {
		case c := <-counts:
			got[c[0]] = c[1]
			done++
		default:
		}
		var err error
		rows, next, err = s.ReadCommits(next, rows[:0], 64)
		if errors.Is(err, store.ErrMissed) {
			// Fell a log behind: every row still committed is in Rows.
			resyncs++
			seq := s.CommitSeq()
			for st := range s.Rows() {
				if st.Seq < seq {
					consume(st)
				}
			}
			next = seq
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range rows {
			consume(st)
		}
		if len(held) == 16 || (len(rows) == 0 && len(held) > 0) {
			for _, v := range held {
				v.Done()
			}
			held = held[:0]
		}
		if len(rows) == 0 {
			if _, err := s.Reclaim(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	for _, w := range writers {
		w.wait(t)
	}
	// The last commits.
	for {
		var err error
		rows, next, err = s.ReadCommits(next, rows[:0], 64)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 0 {
			break
		}
		for _, st := range rows {
			consume(st)
		}
	}
	for _, v := range held {
		v.Done()
	}
	total := 0
	for w := 1; w <= 2; w++ {
		n := got[w]
		if n <= 0 {
			t.Fatalf("writer %d committed %d rows", w, n)
		}
		total += n
		if len(seen[w]) != n || slices.Contains(seen[w], false) {
			missing := slices.Index(seen[w], false)
			t.Fatalf("writer %d committed %d rows, reader saw %d (first missing %d)", w, n, len(seen[w]), missing)
		}
	}
	st := s.Stats()
	if st.Writing != 0 || st.Committed != 0 || st.Doomed != 0 || st.Free != spec.Capacity {
		t.Fatalf("after the soak: %+v", st)
	}
	if st.Commits != uint64(total) {
		t.Fatalf("%d commits, writers report %d", st.Commits, total)
	}
	t.Logf("%v: %d rows committed by 2 writers, all %d read back intact (%d released while pinned, %d resyncs)",
		soakTime(), total, verified, doomed, resyncs)
}

func trim(s string) string {
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == '\r' || s[len(s)-1] == ' ') {
		s = s[:len(s)-1]
	}
	return s
}

// TestConcurrentEviction runs two writer processes against a small FIFO shard that
// is always full, so writers evict while this process reads: every row read is
// intact, and a row evicted under a reader is refused, never torn. The writers
// reserve one row at a time, and then chunks of 8 (sharing the FIFO claim).
func TestConcurrentEviction(t *testing.T) {
	for _, chunk := range []int{1, 8} {
		t.Run(fmt.Sprintf("chunk=%d", chunk), func(t *testing.T) {
			t.Setenv(envChunk, strconv.Itoa(chunk))
			concurrentEviction(t, chunk)
		})
	}
}

func concurrentEviction(t *testing.T, chunk int) {
	s := storetest.Create(t, storetest.Spec(64))
	d := soakTime() / 5
	writers := []*child{
		startChild(t, "writer", s.Name(), "1 "+d.String()),
		startChild(t, "writer", s.Name(), "2 "+d.String()),
	}
	deadline := time.Now().Add(d)
	read, stale, copies := 0, 0, 0
	blocks := make([][]byte, 3)
	for c := range blocks {
		blocks[c] = make([]byte, s.BlockBytes(c))
	}
	for time.Now().Before(deadline) {
		for st := range s.Rows() {
			if read%2 == 0 {
				v, err := s.Read(st.Ref())
				if errors.Is(err, store.ErrStale) {
					stale++
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if id, err := storetest.Check(storetest.Blocks(v)); err != nil || id != st.Key {
					t.Fatalf("row %v (key %d): id %d, %v", st.Ref(), st.Key, id, err)
				}
				v.Done()
			} else {
				ok := true
				for c := range blocks {
					if err := s.CopyBlock(st.Ref(), c, blocks[c]); err != nil {
						if !errors.Is(err, store.ErrStale) {
							t.Fatal(err)
						}
						ok = false
						break
					}
				}
				if !ok {
					stale++
					continue
				}
				if id, err := storetest.Check(blocks); err != nil || id != st.Key {
					t.Fatalf("copied row %v (key %d): id %d, %v", st.Ref(), st.Key, id, err)
				}
				copies++
			}
			read++
		}
	}
	for _, w := range writers {
		if n, err := strconv.Atoi(w.line(t)); err != nil || n <= 0 {
			t.Fatalf("writer committed %d rows (%v)", n, err)
		}
		w.wait(t)
	}
	// The writers' Close freed the rows left in their chunks.
	if st := s.Stats(); st.Writing != 0 || st.Reserved != 0 || st.Committed+st.Free != 64 || st.Free > 2*(chunk-1) {
		t.Fatalf("after eviction test: %+v", st)
	}
	t.Logf("%d rows read intact (%d by copy), %d evicted under the reader and refused", read, copies, stale)
}

// TestKilledWriterIsReclaimed kills a writer between Allocate and Commit: its row is
// never selectable, Reclaim gives it back, and its half-written bytes are never read.
func TestKilledWriterIsReclaimed(t *testing.T) {
	s := storetest.Create(t, storetest.Spec(4))
	insert(t, s, 100, 1)
	c := startChild(t, "hang-writing", s.Name(), "")
	idx, err := strconv.Atoi(c.line(t))
	if err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Writing != 1 {
		t.Fatalf("stats with a writer mid-row: %+v", st)
	}
	if n, _ := s.Reclaim(context.Background()); n != 0 {
		t.Fatalf("reclaimed %d rows of a live writer", n)
	}
	c.kill(t)
	for st := range s.Rows() {
		if st.Index == idx {
			t.Fatalf("the dead writer's row %d is selectable", idx)
		}
	}
	n, err := s.Reclaim(context.Background())
	if err != nil || n != 1 {
		t.Fatalf("Reclaim = %d, %v; want 1", n, err)
	}
	if st := s.Stats(); st.Writing != 0 || st.Free != 3 || st.Committed != 1 {
		t.Fatalf("stats after reclaim: %+v", st)
	}
	// Fill the shard: the reclaimed row is reused, and every row reads back as written.
	for i := range 3 {
		insert(t, s, uint64(i), 1)
	}
	found := false
	for st := range s.Rows() {
		if id := readID(t, s, st.Ref()); id != st.Key {
			t.Fatalf("row %d holds %d, key %d", st.Index, id, st.Key)
		}
		found = found || st.Index == idx
	}
	if !found {
		t.Fatalf("row %d not reused", idx)
	}
}

// TestFullShardReclaimsDeadWriter: with no remover and every row taken, Allocate
// itself finds the dead writer's row.
func TestFullShardReclaimsDeadWriter(t *testing.T) {
	spec := storetest.Spec(2)
	spec.Remover = store.RemoverNone
	s := storetest.Create(t, spec)
	insert(t, s, 1, 1)
	c := startChild(t, "hang-writing", s.Name(), "")
	idx, _ := strconv.Atoi(c.line(t))
	c.kill(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := s.Allocate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.Index() != idx {
		t.Fatalf("allocated row %d, the dead writer's was %d", p.Index(), idx)
	}
	if err := p.Abort(); err != nil {
		t.Fatal(err)
	}
}

// TestKilledCommitterIsSkipped kills a writer inside Commit, after its insertion
// sequence is taken and before the row is published: readers of the commit log
// skip it once the writer is gone, instead of waiting for it forever.
func TestKilledCommitterIsSkipped(t *testing.T) {
	s := storetest.Create(t, storetest.Spec(4))
	c := startChild(t, "hang-committing", s.Name(), "")
	idx, _ := strconv.Atoi(c.line(t))
	if got := c.line(t); got != "committing" {
		t.Fatalf("child says %q", got)
	}
	// While the writer lives, the reader waits at its commit.
	rows, next, err := s.ReadCommits(0, nil, 10)
	if err != nil || len(rows) != 0 || next != 0 {
		t.Fatalf("commit in progress: %v next %d err %v", rows, next, err)
	}
	c.kill(t)
	ref := insert(t, s, 7, 1)
	rows, next, err = s.ReadCommits(0, nil, 10)
	if err != nil || len(rows) != 1 || rows[0].Key != 7 || next != 2 || ref.Seq != 1 {
		t.Fatalf("after the committer died: %+v next %d err %v (ref %v)", rows, next, err, ref)
	}
	for st := range s.Rows() {
		if st.Index == idx {
			t.Fatalf("the dead committer's row %d is selectable", idx)
		}
	}
	if st := s.Stats(); st.Writing != 0 || st.Committed != 1 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestAttachWaitsForSetUp: Attach to a segment whose header is not written waits,
// and fails when the context ends.
func TestAttachWaitsForSetUp(t *testing.T) {
	name := storetest.Name(t, "setup")
	f, err := os.OpenFile("/dev/shm/"+name, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove("/dev/shm/" + name)
	if err := f.Truncate(1 << 16); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err = store.Attach(ctx, name)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("attach to a segment being set up: %v", err)
	}
	if _, err := store.Inspect(name); err == nil {
		t.Fatal("inspect of an empty segment: no error")
	}
}

// TestAttachWaitsForCreation: Attach to a segment that does not exist fails at
// once; with WithWaitForCreation it waits, fails once its context ends with an
// error matching both the deadline and fs.ErrNotExist, and attaches to a shard
// created while it waits.
func TestAttachWaitsForCreation(t *testing.T) {
	name := storetest.Name(t, "later")
	if _, err := store.Attach(t.Context(), name); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("attach to no segment: %v, want fs.ErrNotExist", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
	defer cancel()
	_, err := store.Attach(ctx, name, store.WithWaitForCreation())
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("waiting for a segment never created: %v, want the deadline and fs.ErrNotExist", err)
	}
	got := make(chan error, 1)
	go func() {
		w, err := store.Attach(t.Context(), name, store.WithWaitForCreation())
		if err == nil {
			err = w.Close()
		}
		got <- err
	}()
	time.Sleep(20 * time.Millisecond) // the writer looks first
	owner, err := store.Create(name, storetest.Spec(4))
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	if err := <-got; err != nil {
		t.Fatalf("attach while the owner creates the shard: %v", err)
	}
}

// TestEvictionReclaimsDeadWriter: in a full FIFO shard nobody calls Reclaim, yet a
// dead writer's row comes back within one turnover of the shard (or 1024
// evictions, for a shard as small as this one).
func TestEvictionReclaimsDeadWriter(t *testing.T) {
	s := storetest.Create(t, storetest.Spec(8))
	c := startChild(t, "hang-writing", s.Name(), "")
	idx, _ := strconv.Atoi(c.line(t))
	c.kill(t)
	reused := false
	for i := range 1100 {
		ref := insert(t, s, uint64(i), 1)
		reused = reused || ref.Index == idx
	}
	if st := s.Stats(); st.Writing != 0 || st.Committed != 8 || !reused {
		t.Fatalf("stats %+v, dead writer's row %d reused: %v", st, idx, reused)
	}
}

// TestKilledReaderViewsAreGivenBack: a reader process killed while it holds
// Views (two of one row) pins its rows no longer once Reclaim has run: a row
// released while it was pinned is freed, and a full shard with no free row
// can evict the others again.
func TestKilledReaderViewsAreGivenBack(t *testing.T) {
	s := storetest.Create(t, storetest.Spec(4))
	refs := make([]store.Ref, 4)
	for i := range refs {
		refs[i] = insert(t, s, uint64(i), 1)
	}
	c := startChild(t, "hang-reading", s.Name(), "")
	if got := c.line(t); got != "pinned 5" {
		t.Fatalf("child said %q, want pinned 5", got)
	}
	// Release one pinned row: it stays until its Views are done.
	if err := s.Release(refs[1]); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Doomed != 1 || st.Free != 0 {
		t.Fatalf("stats with the reader alive: %+v", st)
	}
	// Every row is pinned: a writer can take nothing but the doomed row, which
	// is not free yet.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	if p, err := s.Allocate(ctx); err == nil {
		p.Abort()
		t.Fatal("Allocate took a row while every row was pinned")
	}
	cancel()
	if n, _ := s.Reclaim(context.Background()); n != 0 {
		t.Fatalf("Reclaim gave back %d rows of a live reader", n)
	}
	c.kill(t)
	n, err := s.Reclaim(context.Background())
	if err != nil || n != 1 {
		t.Fatalf("Reclaim = %d, %v; want the released row back (1)", n, err)
	}
	if st := s.Stats(); st.Doomed != 0 || st.Free != 1 || st.Committed != 3 {
		t.Fatalf("stats after reclaim: %+v", st)
	}
	// The others are unpinned: a second Reclaim finds nothing, and filling the
	// shard evicts them (FIFO) without waiting.
	if n, _ := s.Reclaim(context.Background()); n != 0 {
		t.Fatalf("a second Reclaim gave back %d rows", n)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 4 {
		p, err := s.Allocate(ctx)
		if err != nil {
			t.Fatalf("allocation %d after reclaim: %v", i, err)
		}
		storetest.Fill(p, uint64(100+i))
		if _, err := p.CommitKey(uint64(100+i), 1); err != nil {
			t.Fatal(err)
		}
	}
	for st := range s.Rows() {
		if st.Key < 100 {
			t.Fatalf("row %d still holds key %d after four inserts into a full FIFO shard", st.Index, st.Key)
		}
	}
}

// TestKilledWriterChunkIsReclaimed kills a writer that holds a chunk: one row
// being written and the rest reserved. While it lives Reclaim leaves them
// alone; after it dies Reclaim frees them all, and a FIFO shard keeps order.
func TestKilledWriterChunkIsReclaimed(t *testing.T) {
	s := storetest.Create(t, storetest.Spec(64))
	t.Setenv(envChunk, "8")
	c := startChild(t, "hang-writing", s.Name(), "")
	idx, err := strconv.Atoi(c.line(t))
	if err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Writing != 1 || st.Reserved != 7 || st.Free != 63 {
		t.Fatalf("stats with a writer mid-row holding a chunk of 8: %+v", st)
	}
	if n, _ := s.Reclaim(context.Background()); n != 0 {
		t.Fatalf("reclaimed %d rows of a live writer", n)
	}
	c.kill(t)
	n, err := s.Reclaim(context.Background())
	if err != nil || n != 8 {
		t.Fatalf("Reclaim = %d, %v; want the row being written and the 7 reserved (8)", n, err)
	}
	if st := s.Stats(); st.Writing != 0 || st.Reserved != 0 || st.Free != 64 {
		t.Fatalf("stats after reclaim: %+v", st)
	}
	// Every row is usable again, the dead writer's half-written one included.
	used := map[int]bool{}
	for i := range 64 {
		used[insert(t, s, uint64(i), 1).Index] = true
	}
	if len(used) != 64 || !used[idx] {
		t.Fatalf("64 inserts used %d rows (the dead writer's row %d: %v)", len(used), idx, used[idx])
	}
}

// TestReservedRowsAreNotStarving: with no remover, a live writer's unused chunk
// does not keep another writer from the last free rows (it takes them over);
// once that writer is dead, the row it was writing comes back to Allocate.
func TestReservedRowsAreNotStarving(t *testing.T) {
	spec := storetest.Spec(16)
	spec.Remover = store.RemoverNone
	s := storetest.Create(t, spec)
	for i := range 8 {
		insert(t, s, uint64(i), 1)
	}
	t.Setenv(envChunk, "8")
	c := startChild(t, "hang-writing", s.Name(), "")
	idx, _ := strconv.Atoi(c.line(t))
	if st := s.Stats(); st.Writing != 1 || st.Reserved != 7 || st.Committed != 8 {
		t.Fatalf("stats with a writer holding the last 8 rows: %+v", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 7 {
		p, err := s.Allocate(ctx)
		if err != nil {
			t.Fatalf("allocation %d of the live writer's reserved rows: %v", i, err)
		}
		if p.Index() == idx {
			t.Fatalf("took row %d, which the live writer is writing", idx)
		}
		storetest.Fill(p, uint64(100+i))
		if _, err := p.CommitKey(uint64(100+i), 1); err != nil {
			t.Fatal(err)
		}
	}
	short, cancelShort := context.WithTimeout(context.Background(), 100*time.Millisecond)
	if p, err := s.Allocate(short); err == nil {
		p.Abort()
		t.Fatalf("took row %d while the only one left is being written", p.Index())
	}
	cancelShort()
	c.kill(t)
	p, err := s.Allocate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.Index() != idx {
		t.Fatalf("allocated row %d, the dead writer's was %d", p.Index(), idx)
	}
	if err := p.Abort(); err != nil {
		t.Fatal(err)
	}
}
