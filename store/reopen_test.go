package store_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gear-rl/gear/sample"
	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// ownerSpec is the layout of the shards the "owner" child makes: no remover, as
// under a sample table.
func ownerSpec(capacity int) store.Spec {
	s := storetest.Spec(capacity)
	s.Remover = store.RemoverNone
	return s
}

// runOwner is the "owner" child: arg is "<capacity> <rows>". It creates the shard,
// commits rows with keys 0..rows-1 (priority key+1, the first ones marked
// sampled key%3 times), allocates one more row and writes half of it, pins row
// 0, prints "ready <pending row>" and waits to be killed.
func runOwner(name, arg string) int {
	f := strings.Fields(arg)
	capacity, _ := strconv.Atoi(f[0])
	rows, _ := strconv.Atoi(f[1])
	s, err := store.Create(name, ownerSpec(capacity))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child owner:", err)
		return 1
	}
	ctx := context.Background()
	var first store.Ref
	for k := range rows {
		p, err := s.Allocate(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, "child owner:", err)
			return 1
		}
		storetest.Fill(p, uint64(k))
		ref, err := p.CommitKey(uint64(k), float64(k+1))
		if err != nil {
			fmt.Fprintln(os.Stderr, "child owner:", err)
			return 1
		}
		for range k % 3 {
			_, _ = s.MarkSampled(ref)
		}
		if k == 0 {
			first = ref
		}
	}
	p, err := s.Allocate(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child owner:", err)
		return 1
	}
	clear(p.Block(0)[:len(p.Block(0))/2])
	if _, err := s.Read(first); err != nil {
		fmt.Fprintln(os.Stderr, "child owner:", err)
		return 1
	}
	fmt.Println("ready", p.Index())
	_, _ = io.Copy(io.Discard, os.Stdin)
	time.Sleep(time.Hour)
	return 0
}

// TestOpenTakesOverAfterKilledOwner: an owner with committed rows, one row
// half-written and one pinned, and a writer mid-row are killed; Open takes the
// shard over with every committed row (keys, data, priorities, times sampled),
// the two half-written rows free again and no pin left; a sample table over
// it holds every committed row at once; the owner's Close removes the segment.
func TestOpenTakesOverAfterKilledOwner(t *testing.T) {
	const capacity, rows = 64, 40
	name := storetest.Name(t, t.Name())
	t.Cleanup(func() { _ = store.Remove(name) })
	owner := startChild(t, "owner", name, fmt.Sprintf("%d %d", capacity, rows))
	ownerPending, err := strconv.Atoi(strings.TrimPrefix(owner.line(t), "ready "))
	if err != nil {
		t.Fatal(err)
	}
	writer := startChild(t, "hang-writing", name, "")
	writerPending, err := strconv.Atoi(writer.line(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Open(name, ownerSpec(capacity)); !errors.Is(err, store.ErrOwnerAlive) {
		t.Fatalf("Open with the owner alive: %v, want ErrOwnerAlive", err)
	}
	owner.kill(t)
	writer.kill(t)

	wrong := ownerSpec(capacity)
	wrong.Columns[1].Shape = []int{3}
	if _, err := store.Open(name, wrong); !errors.Is(err, store.ErrLayout) || !strings.Contains(err.Error(), `"act"`) {
		t.Fatalf("Open with another layout: %v, want ErrLayout naming column act", err)
	}
	s, err := store.CreateOrOpen(name, ownerSpec(capacity))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Reattached() || !s.Owner() {
		t.Fatalf("CreateOrOpen of a dead owner's shard: reattached %v, owner %v", s.Reattached(), s.Owner())
	}
	st := s.Stats()
	if st.Committed != rows || st.Writing != 0 || st.Pinned != 0 || st.Free != capacity-rows || st.Commits != rows {
		t.Fatalf("stats after the take-over: %+v; want %d committed, none writing or pinned, %d free", st, rows, capacity-rows)
	}
	seen := map[uint64]bool{}
	for r := range s.Rows() {
		if r.Index == ownerPending || r.Index == writerPending {
			t.Fatalf("half-written row %d is selectable", r.Index)
		}
		if id := readID(t, s, r.Ref()); id != r.Key {
			t.Fatalf("row %d holds %d, key %d", r.Index, id, r.Key)
		}
		if r.Priority != float64(r.Key+1) || r.TimesSampled != uint32(r.Key%3) {
			t.Fatalf("row %d (key %d): priority %g, sampled %d; want %d, %d", r.Index, r.Key, r.Priority, r.TimesSampled, r.Key+1, r.Key%3)
		}
		seen[r.Key] = true
	}
	if len(seen) != rows {
		t.Fatalf("%d distinct keys committed, want %d", len(seen), rows)
	}

	// A sample table over the re-attached shard holds every row before the first
	// insert, with its priority and times sampled.
	prio, err := sample.NewPrioritized(1)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := sample.NewShardTable(s, sample.Config{Name: "t", Sampler: prio, Remover: sample.NewFIFO(),
		RateLimit: sample.MinSize(1)})
	if err != nil {
		t.Fatal(err)
	}
	info := tb.Info()
	if info.Size != rows || info.Existing != rows || info.Admitted != rows {
		t.Fatalf("table over the re-attached shard: size %d, existing %d, admitted %d; want %d", info.Size, info.Existing, info.Admitted, rows)
	}
	for k := range uint64(rows) {
		it, ok := tb.Get(k)
		if !ok || it.Priority != float64(k+1) || it.TimesSampled != int64(k%3) {
			t.Fatalf("key %d in the table: %+v %v", k, it, ok)
		}
	}
	// New rows come after them, and the free rows (the reclaimed ones among
	// them) take writes.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for k := range uint64(capacity - rows - 1) {
		if _, err := tb.Insert(ctx, 1000+k, 1, func(p store.Pending) error { storetest.Fill(p, 1000+k); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if info := tb.Info(); info.Size != capacity-1 {
		t.Fatalf("table size %d after filling, want %d", info.Size, capacity-1)
	}
	b, err := tb.Sample(ctx, 16)
	if err != nil {
		t.Fatal(err)
	}
	b.Release()
	if err := tb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Inspect(name); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("segment after the new owner's Close: %v", err)
	}
	// Without a segment, Open says so and CreateOrOpen creates one.
	if _, err := store.Open(name, ownerSpec(capacity)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open of no segment: %v", err)
	}
	s, err = store.CreateOrOpen(name, ownerSpec(capacity))
	if err != nil {
		t.Fatal(err)
	}
	if s.Reattached() || s.Stats().Free != capacity {
		t.Fatalf("CreateOrOpen of no segment: reattached %v, %+v", s.Reattached(), s.Stats())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointsMergeIntoFewerShards: three shards are checkpointed, with a
// label each; two shards of room for all of them merge the checkpoints (shard i
// takes checkpoints j with j mod 2 == i) and hold every row, with its key,
// data, priority and times sampled, and the labels read back. Checkpoint 1
// packs its blocks (Packed) where the shards pad them to 64 bytes: rows
// merge block by block, whatever the strides.
func TestCheckpointsMergeIntoFewerShards(t *testing.T) {
	const per = 50
	ctx := context.Background()
	dir := t.TempDir()
	want := map[uint64]store.RowStatus{}
	for j := range 3 {
		spec := ownerSpec(64)
		spec.Packed = j == 1
		s := storetest.Create(t, spec)
		if s.BlockStride(1) != map[bool]int{false: 64, true: 32}[j == 1] {
			t.Fatalf("shard %d: column %q at a stride of %d", j, "act", s.BlockStride(1))
		}
		for k := range per {
			id := uint64(j)<<20 | uint64(k)
			ref := insert(t, s, id, float64(k+1))
			if k%4 == 0 {
				_, _ = s.MarkSampled(ref)
			}
		}
		// Some rows leave before the checkpoint: they must not come back.
		for r := range s.Rows() {
			if r.Key%10 == 9 {
				if err := s.Release(r.Ref()); err != nil {
					t.Fatal(err)
				}
			}
		}
		for r := range s.Rows() {
			want[r.Key] = r
		}
		path := filepath.Join(dir, fmt.Sprintf("shard.%d.ckpt", j))
		if err := s.Checkpoint(ctx, path, store.WithLabel(uint64(j)<<32|3)); err != nil {
			t.Fatal(err)
		}
		info, err := store.ReadCheckpointInfo(path)
		if err != nil || info.Label != uint64(j)<<32|3 || info.Rows != 45 {
			t.Fatalf("checkpoint info of shard %d: %+v, %v", j, info, err)
		}
	}
	got := map[uint64]bool{}
	for i := range 2 {
		s := storetest.Create(t, ownerSpec(128))
		for j := i; j < 3; j += 2 {
			n, err := s.MergeCheckpoint(ctx, filepath.Join(dir, fmt.Sprintf("shard.%d.ckpt", j)))
			if err != nil || n != 45 {
				t.Fatalf("merge checkpoint %d into shard %d: %d rows, %v; want 45", j, i, n, err)
			}
		}
		tb, err := sample.NewShardTable(s, sample.Config{Name: "t", MaxSize: 100, Sampler: sample.NewUniform(), Remover: sample.NewFIFO()})
		if err != nil {
			t.Fatal(err)
		}
		if info := tb.Info(); info.Size != s.Stats().Committed || info.Existing != info.Size {
			t.Fatalf("table over merged shard %d: %+v, shard %+v", i, info, s.Stats())
		}
		tb.Close()
		for r := range s.Rows() {
			w, ok := want[r.Key]
			if !ok || got[r.Key] {
				t.Fatalf("shard %d: key %d unexpected or twice", i, r.Key)
			}
			got[r.Key] = true
			if id := readID(t, s, r.Ref()); id != r.Key {
				t.Fatalf("shard %d row %d holds %d, key %d", i, r.Index, id, r.Key)
			}
			if r.Priority != w.Priority || r.TimesSampled != w.TimesSampled || r.InsertedAt != w.InsertedAt {
				t.Fatalf("key %d: %+v, checkpointed %+v", r.Key, r, w)
			}
		}
	}
	if len(got) != len(want) {
		t.Fatalf("two shards hold %d rows, three checkpoints %d", len(got), len(want))
	}
	// Another layout is refused by name.
	other := storetest.Create(t, store.Spec{Capacity: 8, Remover: store.RemoverNone,
		Columns: []store.Column{{Name: "obs", DType: store.Float32, Shape: []int{4}, Length: 1}}})
	if _, err := other.MergeCheckpoint(ctx, filepath.Join(dir, "shard.0.ckpt")); !errors.Is(err, store.ErrLayout) {
		t.Fatalf("merge into another layout: %v, want ErrLayout", err)
	}
}
