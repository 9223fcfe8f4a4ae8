package gmi

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Mapping is GMI-DRL's GMI-to-GPU mapping list: row g lists the GMI IDs (the
// ranks) placed on the g-th GPU of the job. [[0,1,2],[3,4,5]] puts ranks 0-2
// on one GPU and 3-5 on another. Rows may differ in length (an uneven layout).
type Mapping [][]int

// BlockMapping places ranks 0..n-1 in blocks of perGPU: [[0,1,2],[3,4,5],[6]]
// for n = 7, perGPU = 3. The last GPU holds the remainder.
func BlockMapping(n, perGPU int) Mapping {
	if n <= 0 || perGPU <= 0 {
		return Mapping{}
	}
	m := Mapping{}
	for first := 0; first < n; first += perGPU {
		row := []int{}
		for r := first; r < n && r < first+perGPU; r++ {
			row = append(row, r)
		}
		m = append(m, row)
	}
	return m
}

// Validate checks that no row is empty and that every ID is non-negative and
// appears once.
func (m Mapping) Validate() error {
	seen := map[int][2]int{}
	for g, row := range m {
		if len(row) == 0 {
			return fmt.Errorf("gmi: mapping %s: GPU %d has no GMIs", m, g)
		}
		for s, id := range row {
			if id < 0 {
				return fmt.Errorf("gmi: mapping %s: negative GMI ID %d", m, id)
			}
			if at, dup := seen[id]; dup {
				return fmt.Errorf("gmi: mapping %s: GMI %d on GPU %d and again on GPU %d", m, id, at[0], g)
			}
			seen[id] = [2]int{g, s}
		}
	}
	return nil
}

// GMIs is the number of GMI IDs in the mapping.
func (m Mapping) GMIs() int {
	n := 0
	for _, row := range m {
		n += len(row)
	}
	return n
}

// Locate returns the row (GPU position) and slot of GMI id.
func (m Mapping) Locate(id int) (gpu, slot int, ok bool) {
	for g, row := range m {
		for s, x := range row {
			if x == id {
				return g, s, true
			}
		}
	}
	return 0, 0, false
}

// String writes the mapping as GEAR_GMI_LAYOUT carries it: [[0,1,2],[3,4,5]].
func (m Mapping) String() string {
	var b strings.Builder
	b.WriteByte('[')
	for g, row := range m {
		if g > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('[')
		for s, id := range row {
			if s > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(id))
		}
		b.WriteByte(']')
	}
	b.WriteByte(']')
	return b.String()
}

// ParseMapping reads a mapping list as written by Mapping.String (spaces are
// allowed) and validates it.
func ParseMapping(s string) (Mapping, error) {
	var rows [][]int
	if err := json.Unmarshal([]byte(s), &rows); err != nil || rows == nil {
		return nil, fmt.Errorf("gmi: mapping %q: want a list of lists of GMI IDs such as [[0,1,2],[3,4,5]]", s)
	}
	m := Mapping(rows)
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}
