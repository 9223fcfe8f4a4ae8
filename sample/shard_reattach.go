package sample

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/gear-rl/gear/store"
)

// admitExisting admits the rows the shard held when the table was built (a shard
// re-attached after its owner died, restored from a checkpoint, or merged into),
// oldest first, with their keys, priorities and times sampled. They were admitted
// once already, under the previous owner's rate limiter, so the limiter does not
// hold them back: they count as inserts, and as samples at the limiter's ratio
// (restoredSamples), so that the balance between inserts and samples starts
// where it would be without them. It returns how many it admitted; admission goes on from the
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
	// The rows that these admissions evict go back in row order, as an
	// ingest pass's do (see ShardTable.freed).
	st.t.mu.Lock()
	st.beginPassLocked()
	st.t.mu.Unlock()
	defer func() {
		st.t.mu.Lock()
		st.endPassLocked()
		st.t.mu.Unlock()
	}()
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
// limiter, counting it as an insert and as restoredSamples samples.
func (t *Table) insertAdmitted(it Item) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkPriority(it.Key, it.Priority); err != nil {
		return false, err
	}
	if slot, ok := t.index.get(it.Key); ok {
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
	t.limiter.SetCounts(ins, smp+t.restoredSamples(1), del)
	t.trimLocked()
	return true, nil
}

// restoredSamples is how many samples n rows admitted again (admitExisting,
// ResumeCounts) count as beside their inserts (the caller holds t.mu). Where
// sampling leaves items in the table, SamplesPerInsert each: the balance
// between inserts and samples starts where it would be without the rows,
// since the samples of the items gone since are not known. The counts are
// whole: the fraction left over is carried to the next rows (restoredFrac),
// so that 8 rows at 0.5 count 4 samples, admitted one by one or together.
// Where an item leaves at its first sample (max_times_sampled 1: a Queue, a
// Stack), the rows held are exactly the inserts not yet sampled, which are
// the limiter's whole balance: none, so that a restored queue of n rows gives
// n samples, as Reverb's checkpointed limiter does.
func (t *Table) restoredSamples(n int64) int64 {
	if t.maxTimes == 1 || n <= 0 {
		return 0
	}
	x := t.restoredFrac + float64(n)*t.limiter.Config().SamplesPerInsert
	whole := math.Floor(x + 1e-9) // 1e-9: ten rows at 0.1 make one sample, not 0.999...
	t.restoredFrac = max(x-whole, 0)
	return int64(whole)
}

// ResumeCounts carries the rate limiter's counts over from the table of an
// earlier generation of the job over the same rows (a shard re-attached or
// restored): inserts and samples are that table's Info().Inserts and
// Info().Samples when it held size items, as the caller saved them with its
// checkpoint. The rows the shard held beyond size (committed after the
// counts were saved) count as inserts and as restoredSamples samples each,
// as admitExisting counts them, and deletes are set so that inserts -
// deletes is the table's size now: a restarted table keeps its pace (the
// balance between inserts and samples) and its insert count where the
// earlier one left them, instead of starting from the rows alone. Call it
// once, before the first Insert or Sample; the counts of the rows the table
// admitted at construction are replaced.
//
// Errors: ErrClosed; negative counts, named.
func (st *ShardTable) ResumeCounts(inserts, samples int64, size int) error {
	if inserts < 0 || samples < 0 || size < 0 {
		return fmt.Errorf("sample: table %q: resume counts: inserts %d, samples %d, size %d: want none negative", st.t.name, inserts, samples, size)
	}
	t := st.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return t.errClosed("resume counts")
	}
	now := int64(t.sampler.Len())
	t.restoredFrac = 0 // the counts of the rows admitted at construction are replaced
	if extra := now - int64(size); extra > 0 {
		inserts += extra
		samples += t.restoredSamples(extra)
	}
	inserts = max(inserts, now)
	t.limiter.SetCounts(inserts, samples, inserts-now)
	t.notify()
	return nil
}
