//go:build race

package collective_test

const (
	bigBytes  = 1 << 20
	manyCount = 20011
)

// raceEnabled: tests of many rank processes are skipped.
const raceEnabled = true
