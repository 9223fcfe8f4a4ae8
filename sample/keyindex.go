package sample

// keyIndex maps an item's key to its slot. A key near the last key set
// (within half the dense array's length: insertion sequences, counters,
// gear's keyless rows) lies in a direct-mapped array at the key modulo its
// length, so that consecutive keys take consecutive cells: a full FIFO
// table's inserts and evictions then walk two runs of cells, where hashed
// keys missed the cache on every look-up. Other keys, and a near key whose
// cell holds another, go to keyHash. A key is in one of the two; look-ups
// try the dense cell first while it holds any key. Not safe for concurrent
// use (Table.mu guards it).
type keyIndex struct {
	dense []keyCell
	nd    int    // keys in dense
	last  uint64 // the last key set: the middle of the dense window
	hash  keyHash
}

// cell is key's cell of the dense array (which must not be empty).
func (x *keyIndex) cell(key uint64) *keyCell { return &x.dense[key&uint64(len(x.dense)-1)] }

// near reports whether key lies within half the dense array of the last key.
func (x *keyIndex) near(key uint64) bool {
	d := uint64(len(x.dense))
	return key-x.last+d/2 < d
}

// get returns key's slot.
func (x *keyIndex) get(key uint64) (int32, bool) {
	if x.nd > 0 {
		if c := x.cell(key); c.slot != 0 && c.key == key {
			return c.slot - 1, true
		}
	}
	return x.hash.get(key)
}

// touch reads the cell key would be found in first and returns its slot
// word, so that a caller about to look up or set many keys can bring their
// cells into the cache together (the loads overlap) before it does.
func (x *keyIndex) touch(key uint64) int32 {
	var w int32
	if x.nd > 0 && x.near(key) {
		w = x.cell(key).slot
	}
	if x.hash.n > 0 {
		w += x.hash.touch(key)
	}
	return w
}

// set maps key to slot (slot >= 0).
func (x *keyIndex) set(key uint64, slot int32) {
	if x.nd > 0 {
		if c := x.cell(key); c.slot != 0 && c.key == key {
			c.slot = slot + 1
			return
		}
	}
	if len(x.dense) == 0 {
		x.dense = make([]keyCell, keyIndexMin)
	}
	near := x.near(key)
	x.last = key
	if near {
		if 2*(x.nd+1) > len(x.dense) {
			x.growDense()
		}
		if c := x.cell(key); c.slot == 0 {
			if _, ok := x.hash.get(key); !ok { // at once while the hash is empty
				c.key, c.slot = key, slot+1
				x.nd++
				return
			}
		}
	}
	x.hash.set(key, slot) // a new key, or one the hash holds
}

// growDense doubles the dense array. Keys apart in the old one are apart in
// the new one (keys equal modulo 2n are equal modulo n).
func (x *keyIndex) growDense() {
	old := x.dense
	x.dense = make([]keyCell, 2*len(old))
	for _, c := range old {
		if c.slot != 0 {
			*x.cell(c.key) = c
		}
	}
}

// remove deletes key, if present.
func (x *keyIndex) remove(key uint64) {
	if x.nd > 0 {
		if c := x.cell(key); c.slot != 0 && c.key == key {
			*c = keyCell{}
			x.nd--
			return
		}
	}
	x.hash.remove(key)
}

// len is the number of keys.
func (x *keyIndex) len() int { return x.nd + x.hash.n }

// reset deletes every key, keeping the cells.
func (x *keyIndex) reset() {
	clear(x.dense)
	x.nd, x.last = 0, 0
	x.hash.reset()
}

// keyHash maps the keys keyIndex does not hold densely to their slots: an
// open-addressing hash table with linear probing and backward-shift
// deletion, so that a table cycling its items (a FIFO remover deleting one
// key per insert) leaves no tombstones behind. Go's map does here: its
// probes lengthen with the deleted keys until it rehashes.
type keyHash struct {
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
func (x *keyHash) home(key uint64) int { return int((key * 0x9E3779B97F4A7C15) >> x.shift) }

// get returns key's slot.
func (x *keyHash) get(key uint64) (int32, bool) {
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
func (x *keyHash) touch(key uint64) int32 {
	if len(x.cells) == 0 {
		return 0
	}
	return x.cells[x.home(key)].slot
}

// set maps key to slot (slot >= 0).
func (x *keyHash) set(key uint64, slot int32) {
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
func (x *keyHash) remove(key uint64) {
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

func (x *keyHash) grow() {
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

// reset deletes every key, keeping the cells.
func (x *keyHash) reset() {
	clear(x.cells)
	x.n = 0
}
