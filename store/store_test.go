package store_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/rand"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

func insert(t *testing.T, s *store.Shard, id uint64, prio float64) store.Ref {
	t.Helper()
	p, err := s.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	storetest.Fill(p, id)
	ref, err := p.CommitKey(id, prio)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

func readID(t *testing.T, s *store.Shard, ref store.Ref) uint64 {
	t.Helper()
	v, err := s.Read(ref)
	if err != nil {
		t.Fatalf("read %v: %v", ref, err)
	}
	defer v.Done()
	id, err := storetest.Check(storetest.Blocks(v))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestInsertReadRelease(t *testing.T) {
	s := storetest.Create(t, storetest.Spec(8))
	if _, err := os.Stat("/dev/shm/" + s.Name()); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat("/dev/shm/" + s.Name())
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("segment mode %v, want 0600", fi.Mode().Perm())
	}
	ctx := context.Background()

	// Uncommitted rows are not selectable.
	p, err := s.Allocate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	storetest.Fill(p, 7)
	if n := countRows(s); n != 0 {
		t.Fatalf("%d selectable rows before commit, want 0", n)
	}
	if seq := s.CommitSeq(); seq != 0 {
		t.Fatalf("CommitSeq %d before any commit", seq)
	}
	ref, err := p.CommitKey(7, 2.5)
	if err != nil {
		t.Fatal(err)
	}
	if ref.Seq != 0 || ref.Index != p.Index() {
		t.Fatalf("ref %v, want seq 0 at row %d", ref, p.Index())
	}
	if _, err := p.Commit(1); !errors.Is(err, store.ErrNotPending) {
		t.Fatalf("second commit: %v, want ErrNotPending", err)
	}
	if err := p.Abort(); !errors.Is(err, store.ErrNotPending) {
		t.Fatalf("abort after commit: %v, want ErrNotPending", err)
	}
	if id := readID(t, s, ref); id != 7 {
		t.Fatalf("read id %d, want 7", id)
	}
	st, err := s.Status(ref)
	if err != nil {
		t.Fatal(err)
	}
	if st.Key != 7 || st.Priority != 2.5 || st.Seq != 0 || st.TimesSampled != 0 || st.InsertedAt == 0 {
		t.Fatalf("status %+v", st)
	}
	if err := s.SetPriority(ref, 9); err != nil {
		t.Fatal(err)
	}
	for want := uint32(1); want <= 3; want++ {
		n, err := s.MarkSampled(ref)
		if err != nil || n != want {
			t.Fatalf("MarkSampled = %d, %v; want %d", n, err, want)
		}
	}
	rows := slices.Collect(s.Rows())
	if len(rows) != 1 || rows[0].Priority != 9 || rows[0].TimesSampled != 3 || rows[0].Ref() != ref {
		t.Fatalf("rows %+v", rows)
	}

	// Key defaults to the insertion sequence.
	p2, _ := s.Allocate(ctx)
	storetest.Fill(p2, 8)
	ref2, err := p2.Commit(1)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Status(ref2); st.Key != 1 || ref2.Seq != 1 {
		t.Fatalf("second row %v status %+v: want seq 1 key 1", ref2, st)
	}

	// Release, then the ref is stale everywhere.
	if err := s.Release(ref); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Read(ref); !errors.Is(err, store.ErrStale) {
		t.Fatalf("read after release: %v, want ErrStale", err)
	}
	if err := s.Release(ref); !errors.Is(err, store.ErrStale) {
		t.Fatalf("second release: %v, want ErrStale", err)
	}
	if err := s.SetPriority(ref, 1); !errors.Is(err, store.ErrStale) {
		t.Fatalf("set priority after release: %v, want ErrStale", err)
	}
	if _, err := s.MarkSampled(ref); !errors.Is(err, store.ErrStale) {
		t.Fatalf("mark sampled after release: %v, want ErrStale", err)
	}

	// Abort gives the row back.
	p3, _ := s.Allocate(ctx)
	if err := p3.Abort(); err != nil {
		t.Fatal(err)
	}
	st2 := s.Stats()
	if st2.Free != 7 || st2.Committed != 1 || st2.Writing != 0 || st2.Commits != 2 || st2.Removals != 1 {
		t.Fatalf("stats %+v", st2)
	}
}

func countRows(s *store.Shard) int {
	n := 0
	for range s.Rows() {
		n++
	}
	return n
}

func TestPinnedReleaseIsDeferred(t *testing.T) {
	s := storetest.Create(t, storetest.Spec(2), store.WithSpec(storetest.Spec(2)))
	ref := insert(t, s, 1, 1)
	v1, err := s.Read(ref)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := s.Read(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ref); err != nil {
		t.Fatal(err)
	}
	// Unselectable at once, but its blocks stay put while viewed.
	if n := countRows(s); n != 0 {
		t.Fatalf("%d rows selectable after release", n)
	}
	if _, err := s.Read(ref); !errors.Is(err, store.ErrStale) {
		t.Fatalf("new read of a released row: %v", err)
	}
	if st := s.Stats(); st.Doomed != 1 || st.Free != 1 {
		t.Fatalf("stats %+v, want one doomed, one free", st)
	}
	v1.Done()
	if _, err := storetest.Check(storetest.Blocks(v2)); err != nil {
		t.Fatal(err)
	}
	v2.Done()
	if st := s.Stats(); st.Free != 2 || st.Removals != 1 {
		t.Fatalf("stats %+v, want both free", st)
	}
}

func TestRemovers(t *testing.T) {
	for _, tc := range []struct {
		remover string
		prios   []float64
		want    []uint64 // ids left after inserting 4 more into a full shard of 4
	}{
		{store.RemoverFIFO, []float64{1, 1, 1, 1, 1, 1, 1, 1}, []uint64{4, 5, 6, 7}},
		{store.RemoverLIFO, []float64{1, 1, 1, 1, 1, 1, 1, 1}, []uint64{0, 1, 2, 7}},
		{store.RemoverLowestPriority, []float64{5, 1, 7, 3, 6, 2, 8, 4}, []uint64{2, 4, 6, 7}},
	} {
		t.Run(tc.remover, func(t *testing.T) {
			spec := storetest.Spec(4)
			spec.Remover = tc.remover
			s := storetest.Create(t, spec)
			for i := range 8 {
				insert(t, s, uint64(i), tc.prios[i])
			}
			var ids []uint64
			for st := range s.Rows() {
				if got := readID(t, s, st.Ref()); got != st.Key {
					t.Fatalf("row %v holds payload %d, key %d", st.Ref(), got, st.Key)
				}
				ids = append(ids, st.Key)
			}
			slices.Sort(ids)
			if !slices.Equal(ids, tc.want) {
				t.Fatalf("left %v, want %v", ids, tc.want)
			}
		})
	}
}

func TestLowestPriorityFollowsUpdates(t *testing.T) {
	spec := storetest.Spec(3)
	spec.Remover = store.RemoverLowestPriority
	s := storetest.Create(t, spec)
	a := insert(t, s, 0, 1)
	b := insert(t, s, 1, 2)
	insert(t, s, 2, 3)
	insert(t, s, 3, 4) // evicts 0 (priority 1)
	if _, err := s.Read(a); !errors.Is(err, store.ErrStale) {
		t.Fatalf("row of priority 1 not evicted: %v", err)
	}
	if err := s.SetPriority(b, 10); err != nil { // 1 now outranks 2 and 3
		t.Fatal(err)
	}
	insert(t, s, 4, 5) // evicts 2 (priority 3)
	var ids []uint64
	for st := range s.Rows() {
		ids = append(ids, st.Key)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []uint64{1, 3, 4}) {
		t.Fatalf("left %v, want [1 3 4]", ids)
	}
}

func TestPinnedRowsAreNotEvicted(t *testing.T) {
	s := storetest.Create(t, storetest.Spec(2))
	r0 := insert(t, s, 0, 1)
	insert(t, s, 1, 1)
	v, err := s.Read(r0) // the oldest, FIFO's victim, pinned
	if err != nil {
		t.Fatal(err)
	}
	insert(t, s, 2, 1) // must evict 1 instead
	if got := readID(t, s, r0); got != 0 {
		t.Fatal("pinned row changed")
	}
	// Both rows pinned: Allocate waits until ctx is done.
	r2 := slices.Collect(s.Rows())
	var v2 store.View
	for _, st := range r2 {
		if st.Key == 2 {
			if v2, err = s.Read(st.Ref()); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := s.Allocate(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("allocate with every row pinned: %v, want deadline exceeded", err)
	}
	v.Done()
	v2.Done()
	insert(t, s, 3, 1)
}

func TestRemoverNoneWaitsForRelease(t *testing.T) {
	spec := storetest.Spec(1)
	spec.Remover = store.RemoverNone
	s := storetest.Create(t, spec)
	ref := insert(t, s, 0, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := s.Allocate(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("allocate in a full shard without remover: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p, err := s.Allocate(ctx)
		if err == nil {
			err = p.Abort()
		}
		done <- err
	}()
	time.Sleep(5 * time.Millisecond)
	if err := s.Release(ref); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestReadCommits(t *testing.T) {
	s := storetest.Create(t, storetest.Spec(4))
	var rows []store.RowStatus
	rows, next, err := s.ReadCommits(0, rows, 10)
	if err != nil || len(rows) != 0 || next != 0 {
		t.Fatalf("empty: %v %d %v", rows, next, err)
	}
	var refs []store.Ref
	for i := range 3 {
		refs = append(refs, insert(t, s, uint64(10+i), 1))
	}
	rows, next, err = s.ReadCommits(0, rows[:0], 2)
	if err != nil || len(rows) != 2 || next != 2 || rows[0].Key != 10 || rows[1].Key != 11 {
		t.Fatalf("first two: %+v next %d err %v", rows, next, err)
	}
	if err := s.Release(refs[2]); err != nil {
		t.Fatal(err)
	}
	rows, next, err = s.ReadCommits(next, rows[:0], 10)
	if err != nil || len(rows) != 0 || next != 3 {
		t.Fatalf("released row: %+v next %d err %v", rows, next, err)
	}
	if _, _, err := s.ReadCommits(9, nil, 1); err == nil {
		t.Fatal("reading commits from the future: no error")
	}
	// Fall more than a log's length behind (log of 1024 entries for 4 rows).
	for i := range 1100 {
		insert(t, s, uint64(i), 1)
	}
	if _, _, err := s.ReadCommits(next, nil, 10); !errors.Is(err, store.ErrMissed) {
		t.Fatalf("fell behind: %v, want ErrMissed", err)
	}
	seq := s.CommitSeq()
	if seq != 1103 {
		t.Fatalf("CommitSeq %d, want 1103", seq)
	}
	rows, next, err = s.ReadCommits(seq-4, rows[:0], 10)
	if err != nil || len(rows) != 4 || next != seq || rows[3].Seq != seq-1 {
		t.Fatalf("last four: %+v next %d err %v", rows, next, err)
	}
}

func TestCopyBlock(t *testing.T) {
	s := storetest.Create(t, storetest.Spec(1))
	ref := insert(t, s, 5, 1)
	blocks := make([][]byte, 3)
	for c := range blocks {
		blocks[c] = make([]byte, s.BlockBytes(c))
		if err := s.CopyBlock(ref, c, blocks[c]); err != nil {
			t.Fatal(err)
		}
	}
	if id, err := storetest.Check(blocks); err != nil || id != 5 {
		t.Fatalf("copied row: %d %v", id, err)
	}
	if err := s.CopyBlock(ref, 0, make([]byte, 3)); err == nil || !strings.Contains(err.Error(), `column "obs"`) {
		t.Fatalf("short buffer: %v", err)
	}
	insert(t, s, 6, 1) // evicts 5
	if err := s.CopyBlock(ref, 0, blocks[0]); !errors.Is(err, store.ErrStale) {
		t.Fatalf("copy of an evicted row: %v", err)
	}
}

func TestTypedViews(t *testing.T) {
	spec := store.Spec{Capacity: 2, Columns: []store.Column{
		{Name: "obs", DType: store.Float32, Shape: []int{2, 3}, Length: 2},
		{Name: "half", DType: store.BFloat16, Shape: []int{4}, Length: 1},
		{Name: "done", DType: store.Bool, Length: 3},
		{Name: "r", DType: store.Float64, Length: 2},
	}}
	s := storetest.Create(t, spec)
	p, err := s.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := store.PutFrame(p, 0, 1, []float32{1, 2, 3, 4, 5, 6}, 2, 3); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{store.PutFrame(p, 0, 0, []float32{1, 2, 3}, 3), `store: column "obs": want 2x3 float32, got 3 float32`},
		{store.PutFrame(p, 0, 0, []float32{1, 2, 3}), `store: column "obs": want 2x3 float32 (6 elements), got 3 elements`},
		{store.PutFrame(p, 0, 0, []uint8{1, 2, 3, 4, 5, 6}), `store: column "obs": want 2x3 float32, got uint8`},
		{store.PutFrame(p, 0, 2, []float32{1, 2, 3, 4, 5, 6}), `store: column "obs": frame 2 out of range [0, 2)`},
		{store.PutBlock(p, 0, make([]float32, 12), 3, 2, 2), `store: column "obs": want 2x2x3 float32, got 3x2x2 float32`},
		{store.PutBlock(p, 3, make([]float64, 3)), `store: column "r": want 2 float64 (2 elements), got 3 elements`},
	} {
		if tc.err == nil || tc.err.Error() != tc.want {
			t.Errorf("error %q, want %q", tc.err, tc.want)
		}
	}
	if err := store.PutBlock(p, 0, make([]float32, 12), 2, 2, 3); err != nil {
		t.Fatal(err)
	}
	if err := store.PutFrame(p, 0, 1, []float32{1, 2, 3, 4, 5, 6}, 2, 3); err != nil {
		t.Fatal(err)
	}
	if err := store.PutBlock(p, 1, []store.BFloat16Bits{1, 2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	done, err := store.Block[bool](p, 2)
	if err != nil || len(done) != 3 {
		t.Fatalf("bool block: %v %v", done, err)
	}
	done[2] = true
	ref, err := p.Commit(1)
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.Read(ref)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Done()
	f1, err := store.Frame[float32](v, 0, 1)
	if err != nil || !slices.Equal(f1, []float32{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("frame 1: %v %v", f1, err)
	}
	if d, _ := store.Block[bool](v, 2); !slices.Equal(d, []bool{false, false, true}) {
		t.Fatalf("done: %v", d)
	}
	if _, err := store.Block[store.Float16Bits](v, 1); err == nil || err.Error() != `store: column "half": want 4 bfloat16, got float16` {
		t.Fatalf("float16 view of a bfloat16 column: %v", err)
	}
}

func TestSpecErrors(t *testing.T) {
	col := func(name string, d store.DType, length int, shape ...int) store.Column {
		return store.Column{Name: name, DType: d, Shape: shape, Length: length}
	}
	for _, tc := range []struct {
		spec store.Spec
		want string
	}{
		{store.Spec{Capacity: 0, Columns: []store.Column{col("a", store.Uint8, 1)}}, "store: capacity 0: want at least 1"},
		{store.Spec{Capacity: 1 << 31, Columns: []store.Column{col("a", store.Uint8, 1)}}, "store: capacity 2147483648: at most 1073741824 rows"},
		{store.Spec{Capacity: 1}, "store: no columns"},
		{store.Spec{Capacity: 1, Columns: []store.Column{col("obs", store.Float32, 4, 84, 0)}}, `store: column "obs": shape 84x0: dimensions must be positive`},
		{store.Spec{Capacity: 1, Columns: []store.Column{col("obs", store.Float32, 0, 84)}}, `store: column "obs": length 0: want at least 1 frame`},
		{store.Spec{Capacity: 1, Columns: []store.Column{col("obs", 0, 1)}}, `store: column "obs": invalid element type 0`},
		{store.Spec{Capacity: 1, Columns: []store.Column{col("a", store.Uint8, 1), col("a", store.Uint8, 1)}}, `store: column "a" appears twice`},
		{store.Spec{Capacity: 1, Columns: []store.Column{col("", store.Uint8, 1)}}, `store: column 0 has no name`},
		{store.Spec{Capacity: 1, Columns: []store.Column{col("obs", store.Float64, 1<<30, 1<<20, 1<<20)}},
			`store: column "obs": a block of 1048576x1048576 float64 (length 1073741824) overflows (more than 2^64 bytes, at most 1099511627776)`},
		{store.Spec{Capacity: 1 << 27, Columns: []store.Column{col("obs", store.Float32, 1, 1<<18)}},
			`store: column "obs": 134217728 blocks of 262144 float32 (length 1) overflow (140737488355328 bytes, at most 70368744177664)`},
		{store.Spec{Capacity: 1 << 25, Columns: []store.Column{col("a", store.Uint8, 1, 1<<20), col("b", store.Uint8, 1, 1<<20), col("c", store.Uint8, 1, 1<<20)}},
			`store: column "c": the shard's column tables overflow (105553116266496 bytes, at most 70368744177664)`},
		{store.Spec{Capacity: 1, BlockAlign: 100, Columns: []store.Column{col("a", store.Uint8, 1)}}, "store: block alignment 100: want a power of two from 64 to 65536"},
	} {
		err := tc.spec.Validate()
		if err == nil {
			if tc.want != "" {
				t.Errorf("%+v: no error, want %q", tc.spec, tc.want)
			}
			continue
		}
		if err.Error() != tc.want {
			t.Errorf("error %q\n want %q", err, tc.want)
		}
		if _, err := store.Create(storetest.Name(t, "bad"), tc.spec); err == nil {
			t.Errorf("Create accepted %+v", tc.spec)
		}
	}
	if _, err := store.Create("bad/name", storetest.Spec(1)); err == nil {
		t.Error("Create accepted a name with a slash")
	}
	spec := storetest.Spec(1)
	spec.Remover = "mine"
	if _, err := store.Create(storetest.Name(t, "bad"), spec); err == nil || !strings.Contains(err.Error(), `remover "mine" is not built in`) {
		t.Errorf("unknown remover: %v", err)
	}
}

func TestAttachChecksLayout(t *testing.T) {
	s := storetest.Create(t, storetest.Spec(4))
	ctx := context.Background()
	a, err := store.Attach(ctx, s.Name(), store.WithSpec(storetest.Spec(4)))
	if err != nil {
		t.Fatal(err)
	}
	if a.Owner() || !s.Owner() {
		t.Fatal("ownership wrong")
	}
	ref := insert(t, a, 3, 1)
	if got := readID(t, s, ref); got != 3 {
		t.Fatalf("owner reads %d", got)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal("second close:", err)
	}
	if _, err := a.Allocate(ctx); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("allocate after close: %v", err)
	}

	other := storetest.Spec(4)
	other.Columns[0].Shape = []int{8, 4}
	other.Columns[0].DType = store.Uint8
	_, err = store.Attach(ctx, s.Name(), store.WithSpec(other))
	if !errors.Is(err, store.ErrLayout) || !strings.Contains(err.Error(), `column "obs": shard has 8x8 float32 (length 4), spec has 8x4 uint8 (length 4)`) {
		t.Fatalf("attach with another layout: %v", err)
	}
	other = storetest.Spec(5)
	if _, err := store.Attach(ctx, s.Name(), store.WithSpec(other)); err == nil || !strings.Contains(err.Error(), "capacity: shard has 4 rows, spec has 5") {
		t.Fatalf("attach with another capacity: %v", err)
	}
	if _, err := store.Attach(ctx, storetest.Name(t, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("attach to a missing shard: %v", err)
	}
	if _, err := store.Attach(ctx, s.Name(), store.WithRemover(store.LIFO{})); !errors.Is(err, store.ErrLayout) {
		t.Fatalf("attach with another remover: %v", err)
	}
	if _, err := store.Create(s.Name(), storetest.Spec(4)); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("create over an existing shard: %v", err)
	}

	info, err := store.Inspect(s.Name())
	if err != nil {
		t.Fatal(err)
	}
	if info.OwnerPID != os.Getpid() || !info.OwnerAlive || !info.Ready || info.Spec.Capacity != 4 {
		t.Fatalf("inspect: %+v", info)
	}
}

func TestOwnerCloseRemovesSegment(t *testing.T) {
	name := storetest.Name(t, "close")
	s, err := store.Create(name, storetest.Spec(2))
	if err != nil {
		t.Fatal(err)
	}
	a, err := store.Attach(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal("second close:", err)
	}
	if _, err := os.Stat("/dev/shm/" + name); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("segment still there after the owner's close: %v", err)
	}
	if _, err := a.Allocate(context.Background()); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("allocate after the owner closed: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := store.Remove(name); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("remove of a removed segment: %v", err)
	}
}

func TestColumnTablesArePageAligned(t *testing.T) {
	spec := store.Spec{Capacity: 3, Columns: []store.Column{
		{Name: "a", DType: store.Uint8, Shape: []int{100}, Length: 3},
		{Name: "b", DType: store.Float64, Length: 1},
	}, BlockAlign: 256}
	s := storetest.Create(t, spec)
	page := os.Getpagesize()
	for c := range 2 {
		tab := s.ColumnTable(c)
		base := uintptrOf(tab)
		if base%uintptr(page) != 0 || len(tab)%page != 0 {
			t.Errorf("column %d table at %#x, %d bytes: not page-aligned", c, base, len(tab))
		}
		for i := range 3 {
			off := s.BlockOffset(c, i)
			if off%256 != 0 {
				t.Errorf("column %d block %d at offset %d: not 256-aligned", c, i, off)
			}
		}
	}
	if s.BlockBytes(0) != 300 || s.BlockStride(0) != 512 {
		t.Errorf("block %d stride %d", s.BlockBytes(0), s.BlockStride(0))
	}
	if math.Mod(float64(uintptrOf(s.Mapping())), float64(page)) != 0 {
		t.Error("mapping not page-aligned")
	}
}

// By default every block starts on 64 bytes (aligned for DMA); with Packed,
// blocks smaller than the alignment pack at their size rounded up to a power
// of two, never straddling a cache line, and the others keep it. A shard's
// packing is part of its layout: asking for the other is refused.
func TestPackedBlocks(t *testing.T) {
	cols := []store.Column{
		{Name: "reward", DType: store.Float32, Length: 1},
		{Name: "pos", DType: store.Float32, Shape: []int{3}, Length: 1},
		{Name: "flag", DType: store.Bool, Length: 1},
		{Name: "tail", DType: store.Uint8, Shape: []int{100}, Length: 1},
		{Name: "obs", DType: store.Float32, Shape: []int{96}, Length: 1},
	}
	padded := storetest.Create(t, store.Spec{Capacity: 40, Columns: cols})
	packed := storetest.Create(t, store.Spec{Capacity: 40, Columns: cols, Packed: true})
	for c, want := range []struct{ padded, packed int }{{64, 4}, {64, 16}, {64, 1}, {128, 128}, {384, 384}} {
		if got := padded.BlockStride(c); got != want.padded {
			t.Errorf("default: column %q stride %d, want %d", cols[c].Name, got, want.padded)
		}
		if got := packed.BlockStride(c); got != want.packed {
			t.Errorf("packed: column %q stride %d, want %d", cols[c].Name, got, want.packed)
		}
		for i := range 40 {
			if off := padded.BlockOffset(c, i); off%64 != 0 {
				t.Errorf("default: column %q block %d at %d: not 64-aligned", cols[c].Name, i, off)
			}
			off, n := packed.BlockOffset(c, i), packed.BlockBytes(c)
			if n < 64 && off/64 != (off+n-1)/64 || n >= 64 && off%64 != 0 {
				t.Errorf("packed: column %q block %d at %d, %d bytes: straddles a cache line or starts off one", cols[c].Name, i, off, n)
			}
		}
	}
	ctx := context.Background()
	a, err := store.Attach(ctx, packed.Name(), store.WithSpec(store.Spec{Capacity: 40, Columns: cols, Packed: true}))
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	_, err = store.Attach(ctx, packed.Name(), store.WithSpec(store.Spec{Capacity: 40, Columns: cols}))
	if !errors.Is(err, store.ErrLayout) || !strings.Contains(err.Error(), "packed blocks: shard has true, spec has false") {
		t.Fatalf("attach to a packed shard with an unpacked spec: %v", err)
	}
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

func newRand(seed int64) *rand.Rand { return rand.New(rand.NewSource(seed)) }

// TestRemoversMatchModel checks every eviction against a naive model that looks at
// all rows, over random inserts, releases, priority changes and pins, in a shard
// large enough that the evictor keeps only part of the rows as candidates.
func TestRemoversMatchModel(t *testing.T) {
	type row struct {
		ref    store.Ref
		prio   float64
		view   *store.View
		exists bool
	}
	for _, tc := range []struct {
		rem  store.Remover
		seed int64
	}{{store.FIFO{}, 1}, {store.FIFO{}, 2}, {store.LIFO{}, 1}, {store.LIFO{}, 2}, {store.LowestPriority{}, 1}, {store.LowestPriority{}, 2}} {
		rem := tc.rem
		t.Run(fmt.Sprintf("%s/seed=%d", rem.Name(), tc.seed), func(t *testing.T) {
			const capacity = 300
			spec := storetest.Spec(capacity)
			spec.Remover = rem.Name()
			s := storetest.Create(t, spec)
			rng := newRand(tc.seed)
			rows := make([]row, capacity)
			used := 0
			ctx := context.Background()
			for step := range 6000 {
				switch op := rng.Intn(100); {
				case op < 60: // insert
					var want int = -1
					if used == capacity {
						for i, r := range rows {
							if !r.exists || r.view != nil {
								continue
							}
							if want < 0 || rem.Before(
								store.RowStatus{Seq: r.ref.Seq, Priority: r.prio},
								store.RowStatus{Seq: rows[want].ref.Seq, Priority: rows[want].prio}) {
								want = i
							}
						}
					}
					p, err := s.Allocate(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if want >= 0 && p.Index() != want {
						t.Fatalf("step %d: evicted row %d (seq %d prio %v), model says row %d (seq %d prio %v)", step,
							p.Index(), rows[p.Index()].ref.Seq, rows[p.Index()].prio, want, rows[want].ref.Seq, rows[want].prio)
					}
					if rows[p.Index()].exists && want < 0 {
						t.Fatalf("step %d: row %d evicted while %d rows used", step, p.Index(), used)
					}
					prio := float64(rng.Intn(50))
					ref, err := p.Commit(prio)
					if err != nil {
						t.Fatal(err)
					}
					if !rows[ref.Index].exists {
						used++
					}
					rows[ref.Index] = row{ref: ref, prio: prio, exists: true}
				case op < 75: // release
					i := rng.Intn(capacity)
					if rows[i].exists && rows[i].view == nil {
						if err := s.Release(rows[i].ref); err != nil {
							t.Fatal(err)
						}
						rows[i] = row{}
						used--
					}
				case op < 90: // priority change (only up for lowest_priority: see evictor)
					i := rng.Intn(capacity)
					if rows[i].exists {
						p := rows[i].prio + float64(rng.Intn(20))
						if rem.Name() != store.RemoverLowestPriority {
							p = float64(rng.Intn(50))
						}
						if err := s.SetPriority(rows[i].ref, p); err != nil {
							t.Fatal(err)
						}
						rows[i].prio = p
					}
				default: // pin or unpin
					i := rng.Intn(capacity)
					if !rows[i].exists {
						continue
					}
					if rows[i].view != nil {
						rows[i].view.Done()
						rows[i].view = nil
					} else {
						v, err := s.Read(rows[i].ref)
						if err != nil {
							t.Fatal(err)
						}
						rows[i].view = &v
					}
				}
			}
			for _, r := range rows {
				if r.view != nil {
					r.view.Done()
				}
			}
		})
	}
}

// A name that cannot name a segment is refused by every call that takes one,
// with an error matching ErrName (libgear makes it an invalid argument).
func TestBadSegmentNames(t *testing.T) {
	spec := store.Spec{Capacity: 2, Columns: []store.Column{{Name: "x", DType: store.Uint8, Length: 1}}}
	for _, name := range []string{"", ".", "..", "a/b", "a\x00b", strings.Repeat("x", 256)} {
		if _, err := store.Create(name, spec); !errors.Is(err, store.ErrName) {
			t.Errorf("Create(%q): %v, want ErrName", name, err)
		}
		if _, err := store.Attach(t.Context(), name); !errors.Is(err, store.ErrName) {
			t.Errorf("Attach(%q): %v, want ErrName", name, err)
		}
		if err := store.Remove(name); !errors.Is(err, store.ErrName) {
			t.Errorf("Remove(%q): %v, want ErrName", name, err)
		}
	}
}

// A handle holding more Views than its pin journal has entries records the
// first PinEntries (those a reclaimer can give back) and no more; once they
// are done, the journal records Views again.
func TestPinJournalFillsAndEmpties(t *testing.T) {
	s := storetest.Create(t, storetest.Spec(2), store.WithSpec(storetest.Spec(2)))
	ref := insert(t, s, 1, 1)
	read := func(n int) []store.View {
		vs := make([]store.View, n)
		for i := range vs {
			v, err := s.Read(ref)
			if err != nil {
				t.Fatalf("view %d: %v", i, err)
			}
			vs[i] = v
		}
		return vs
	}
	vs := read(store.PinEntries + 100)
	if e, h := store.Journal(s); e != store.PinEntries || h != store.PinEntries {
		t.Fatalf("%d views: %d entries, %d held, want %d", len(vs), e, h, store.PinEntries)
	}
	for _, v := range vs {
		v.Done()
	}
	if e, h := store.Journal(s); e != 0 || h != 0 {
		t.Fatalf("after Done: %d entries, %d held, want none", e, h)
	}
	vs = read(10)
	if e, h := store.Journal(s); e != 10 || h != 10 {
		t.Fatalf("10 views: %d entries, %d held", e, h)
	}
	for _, v := range vs {
		v.Done()
	}
	if st := s.Stats(); st.Free != 1 {
		t.Fatalf("stats %+v: the row is still pinned", st)
	}
}

// TestReleaseAll releases a run of rows at once: stale and out-of-range refs
// are passed over, a viewed row waits for its view, and the freed rows go
// back to the free queue in the run's order.
func TestReleaseAll(t *testing.T) {
	s := storetest.Create(t, storetest.Spec(8))
	refs := make([]store.Ref, 8)
	for i := range refs {
		refs[i] = insert(t, s, uint64(i), 1)
	}
	v, err := s.Read(refs[3])
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(refs[6]); err != nil {
		t.Fatal(err)
	}
	if r := insert(t, s, 100, 1); r.Index != 6 {
		t.Fatalf("the one free row is %d, want 6", r.Index)
	}
	removals := s.Stats().Removals
	run := []store.Ref{refs[5], refs[2], refs[6], {Index: 99}, {Index: -1}, refs[3], refs[7]}
	if n := s.ReleaseAll(run); n != 4 {
		t.Fatalf("ReleaseAll released %d, want 4 (rows 5, 2, 3 and 7)", n)
	}
	if st := s.Stats(); st.Free != 3 || st.Doomed != 1 || st.Removals != removals+3 {
		t.Fatalf("stats %+v; want 3 free, 1 doomed, %d removals", st, removals+3)
	}
	if n := countRows(s); n != 4 {
		t.Fatalf("%d rows selectable, want 4", n)
	}
	if _, err := s.Read(refs[2]); !errors.Is(err, store.ErrStale) {
		t.Fatalf("read of a released row: %v", err)
	}
	for _, want := range []int{5, 2, 7} {
		if r := insert(t, s, uint64(200+want), 1); r.Index != want {
			t.Fatalf("allocated row %d, want %d: the run's order", r.Index, want)
		}
	}
	v.Done()
	if r := insert(t, s, 300, 1); r.Index != 3 {
		t.Fatalf("allocated row %d, want 3, freed by its view's Done", r.Index)
	}
	if n := s.ReleaseAll(nil); n != 0 {
		t.Fatalf("ReleaseAll of nothing released %d", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := s.ReleaseAll(refs); n != 0 {
		t.Fatalf("ReleaseAll after Close released %d", n)
	}
}

// TestPrefetchStatusChangesNothing asks for rows' lines ahead, in range and
// not, and after Close: no row's status changes, and nothing faults.
func TestPrefetchStatusChangesNothing(t *testing.T) {
	s := storetest.Create(t, storetest.Spec(8))
	for i := range 5 {
		insert(t, s, uint64(i), float64(i))
	}
	before, st := slices.Collect(s.Rows()), s.Stats()
	s.PrefetchStatus([]int{0, 3, 7, -1, 8, 1 << 40})
	if after := slices.Collect(s.Rows()); !slices.Equal(after, before) || s.Stats() != st {
		t.Fatalf("rows %v and stats %+v after PrefetchStatus, want %v and %+v", after, s.Stats(), before, st)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.PrefetchStatus([]int{0, 1, 2}) // unmapped: must not touch the memory
}
