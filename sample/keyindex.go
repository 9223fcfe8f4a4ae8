package sample

// keyIndex maps an item's key to its slot: an open-addressing hash table with
// linear probing and backward-shift deletion, so that a table cycling its
// items (a FIFO remover deleting one key per insert) leaves no tombstones
// behind. Go's map does here: its probes lengthen with the deleted keys
// until it rehashes, which made the key lookups of a full table's inserts
// the largest cost of admission. Not safe for concurrent use (Table.mu
// guards it).
type keyIndex struct {
	cells []keyCell
	n     int
	shift uint // 64 - log2(len(cells))
}

type keyCell struct {
	key  uint64
	slot int32 // the slot plus one; 0: the cell is empty
}

const keyIndexMin = 16

// home is key's first cell: Fibonacci hashing, the top bits of the product.
func (x *keyIndex) home(key uint64) int { return int((key * 0x9E3779B97F4A7C15) >> x.shift) }

// get returns key's slot.
func (x *keyIndex) get(key uint64) (int32, bool) {
	if x.n == 0 {
		return 0, false
	}
	mask := len(x.cells) - 1
	for i := x.home(key); ; i = (i + 1) & mask {
		c := &x.cells[i]
		if c.slot == 0 {
			return 0, false
		}
		if c.key == key {
			return c.slot - 1, true
		}
	}
}

// touch reads key's home cell and returns its slot word, so that a caller
// about to look up or set many keys can bring their cells into the cache
// together (the loads overlap) before it does.
func (x *keyIndex) touch(key uint64) int32 {
	if len(x.cells) == 0 {
		return 0
	}
	return x.cells[x.home(key)].slot
}

// set maps key to slot (slot >= 0).
func (x *keyIndex) set(key uint64, slot int32) {
	if 2*(x.n+1) > len(x.cells) {
		x.grow()
	}
	mask := len(x.cells) - 1
	for i := x.home(key); ; i = (i + 1) & mask {
		c := &x.cells[i]
		if c.slot == 0 {
			c.key, c.slot = key, slot+1
			x.n++
			return
		}
		if c.key == key {
			c.slot = slot + 1
			return
		}
	}
}

// remove deletes key, if present, moving the cells of its probe run back so
// that every key stays reachable from its home cell.
func (x *keyIndex) remove(key uint64) {
	if x.n == 0 {
		return
	}
	mask := len(x.cells) - 1
	i := x.home(key)
	for {
		c := &x.cells[i]
		if c.slot == 0 {
			return
		}
		if c.key == key {
			break
		}
		i = (i + 1) & mask
	}
	x.n--
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		c := x.cells[j]
		if c.slot == 0 {
			break
		}
		// c may move back to the hole at i unless its home lies in (i, j]
		// (cyclically): then it would fall before its home.
		h := x.home(c.key)
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			x.cells[i] = c
			i = j
		}
	}
	x.cells[i] = keyCell{}
}

func (x *keyIndex) grow() {
	old := x.cells
	n := max(2*len(old), keyIndexMin)
	x.cells = make([]keyCell, n)
	x.shift = 64
	for 1<<(64-x.shift) < n {
		x.shift--
	}
	x.n = 0
	for _, c := range old {
		if c.slot != 0 {
			x.set(c.key, c.slot-1)
		}
	}
}

// len is the number of keys.
func (x *keyIndex) len() int { return x.n }

// reset deletes every key, keeping the cells.
func (x *keyIndex) reset() {
	clear(x.cells)
	x.n = 0
}
