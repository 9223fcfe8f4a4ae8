//go:build !race

package collective_test

// bigBytes is the size of the largest buffers the suite moves: 64 MiB, or 1 MiB
// under the race detector, which makes every memory access many times slower.
// manyCount is the suite's count of elements that spans several chunks.
const (
	bigBytes  = 64 << 20
	manyCount = 100003
)

// raceEnabled: tests of many rank processes are skipped under the race
// detector.
const raceEnabled = false
