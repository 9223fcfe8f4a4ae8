package sample

import (
	"cmp"
	"slices"

	"github.com/gear-rl/gear/store"
)

// admitExisting admits the rows the shard held when the table was built (a shard
// re-attached after its owner died, restored from a checkpoint, or merged into),
// oldest first, with their keys, priorities and times sampled. They were admitted
// once already, under the previous owner's rate limiter, so the limiter does not
// hold them back: they count as inserts, and as samples at the limiter's ratio,
// so that the balance between inserts and samples starts where it would be
// without them. It returns how many it admitted; admission goes on from the
// shard's commit sequence at the time of the call.
func (st *ShardTable) admitExisting() int {
	seq := st.shard.CommitSeq()
	var rows []store.RowStatus
	for r := range st.shard.Rows() {
		if r.Seq < seq {
			rows = append(rows, r)
		}
	}
	slices.SortFunc(rows, func(a, b store.RowStatus) int { return cmp.Compare(a.Seq, b.Seq) })
	n := 0
	for _, r := range rows {
		it := Item{Key: r.Key, Ref: r.Seq, Priority: r.Priority, TimesSampled: int64(r.TimesSampled),
			Seq: r.Seq, Inserted: r.InsertedAt, Index: r.Index}
		added, err := st.t.insertAdmitted(it)
		switch {
		case err != nil:
			_ = st.shard.Release(r.Ref())
			st.refused++
			st.lastErr = err
		case !added: // a duplicate key: the row is not needed
			_ = st.shard.Release(r.Ref())
		default:
			n++
		}
	}
	st.next = seq
	return n
}

// insertAdmitted inserts an item at its row without waiting on the rate
// limiter, counting it as an insert and as SamplesPerInsert samples.
func (t *Table) insertAdmitted(it Item) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkPriority(it.Key, it.Priority); err != nil {
		return false, err
	}
	if slot, ok := t.index[it.Key]; ok {
		t.setPriority(int(slot), it.Priority)
		return false, nil
	}
	slot := it.Index
	t.ensureSlot(slot)
	if t.live[slot] {
		return false, nil
	}
	t.placeLocked(slot, it)
	ins, smp, del := t.limiter.Counts()
	t.limiter.SetCounts(ins, smp+int64(t.limiter.Config().SamplesPerInsert+0.5), del)
	t.trimLocked()
	return true, nil
}
