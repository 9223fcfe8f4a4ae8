package sample

// victimsAhead is how many of a full table's next evictions touchVictims
// prepares at a time, and how far ahead of the eviction it looks.
const victimsAhead = 8

// aheadOrder is a remover that lists the slots it will likely pick next,
// cheaply (Sequence: entries side by side in its ring).
type aheadOrder interface {
	Ahead(i, k int, dst []int) []int
}

// toucher is a selector that can load what deleting a slot will read.
type toucher interface {
	touch(slot int) uint64
}

// touchVictims runs after each eviction of trimLocked. Every victimsAhead
// evictions it loads the cells that deleting the remover's next victims but
// victimsAhead will read: their items, key index cells and selector
// entries, the loads of all of them overlapping, and asks for their shard
// rows' status lines without waiting (touchRows). A full
// table's every insert evicts an item inserted a table's length before,
// whose cells have left the cache, and each delete would otherwise wait for
// its own misses in turn (the key's cell only once the item's load gave the
// key). Removers that cannot list their next picks cheaply get nothing.
func (t *Table) touchVictims() {
	t.evictions++
	if t.evictions%victimsAhead != 0 {
		return
	}
	q, ok := t.remover.(aheadOrder)
	if !ok {
		return
	}
	slots := q.Ahead(victimsAhead, victimsAhead, t.ahead[:0])
	sampler, _ := t.sampler.(toucher)
	remover, _ := t.remover.(toucher)
	var keys [victimsAhead]uint64
	var x uint64
	for i, s := range slots {
		if s >= len(t.items) {
			continue
		}
		keys[i] = t.items[s].Key
		if t.live[s] {
			x++
		}
		if sampler != nil {
			x += sampler.touch(s)
		}
		if remover != nil {
			x += remover.touch(s)
		}
	}
	for i := range slots {
		x += uint64(t.index.touch(keys[i]))
	}
	if t.touchRows != nil {
		t.touchRows(slots)
	}
	loadSink.Add(x)
}

// touch reads slot's position and the position's entry.
func (s *slotIndex) touch(slot int) uint64 {
	if slot < 0 || slot >= len(s.pos) {
		return 0
	}
	p := s.pos[slot]
	if p < 0 || int(p) >= len(s.slots) {
		return 0
	}
	return uint64(s.slots[p])
}

func (u *Uniform) touch(slot int) uint64 { return u.idx.touch(slot) }

func (q *Sequence) touch(slot int) uint64 {
	if slot < 0 || slot >= len(q.pos) {
		return 0
	}
	return uint64(q.pos[slot])
}
