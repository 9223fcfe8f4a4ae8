package sample

import (
	"context"
	"testing"
)

// TestCollectBatch gathers batches through one plan: items still in the
// table, items their sample deleted (max_times_sampled 1, read through the
// batch's pins), and the errors of a short buffer, a plan of another table
// and a released batch whose rows were freed.
func TestCollectBatch(t *testing.T) {
	st, sh := shardTable(t, 16, Config{MaxSize: 8, Sampler: NewFIFO(), Remover: NewFIFO()})
	ctx := context.Background()
	for k := range uint64(6) {
		if _, err := st.Insert(ctx, k, 1, fill(k)); err != nil {
			t.Fatal(err)
		}
	}
	p, bufs := planBuffers(t, st, testColumns, 3)
	var b Batch
	for round := range 2 {
		if err := st.SampleInto(ctx, &b, 3); err != nil {
			t.Fatal(err)
		}
		if err := st.CollectBatch(ctx, p, &b, bufs); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for k, it := range b.Items {
			checkCollected(t, sh, bufs, k, it.Key)
		}
	}
	b.Release()

	deleting, dsh := shardTable(t, 16, Config{MaxSize: 8, Sampler: NewFIFO(), Remover: NewFIFO(), MaxTimesSampled: 1})
	for k := range uint64(4) {
		if _, err := deleting.Insert(ctx, 10+k, 1, fill(10+k)); err != nil {
			t.Fatal(err)
		}
	}
	dp, err := deleting.PlanCollect(testColumns, Window{})
	if err != nil {
		t.Fatal(err)
	}
	if err := deleting.SampleInto(ctx, &b, 3); err != nil {
		t.Fatal(err)
	}
	if info := deleting.Info(); info.Held != 3 {
		t.Fatalf("held %d rows after a sample that deleted 3", info.Held)
	}
	if err := deleting.CollectBatch(ctx, dp, &b, bufs); err != nil {
		t.Fatal(err)
	}
	for k, it := range b.Items {
		if !it.Deleted {
			t.Fatalf("item %d (key %d) not deleted by its sample", k, it.Key)
		}
		checkCollected(t, dsh, bufs, k, it.Key)
	}
	if err := deleting.CollectBatch(ctx, p, &b, bufs); err == nil {
		t.Fatal("collected with another table's plan")
	}
	short := [][]byte{bufs[0][:1], bufs[1], bufs[2]}
	if err := deleting.CollectBatch(ctx, dp, &b, short); err == nil {
		t.Fatal("collected into a 1-byte buffer")
	}
	b.Release()
	if err := deleting.CollectBatch(ctx, dp, &b, bufs); err == nil {
		t.Fatal("collected the deleted rows of a released batch")
	}
}
