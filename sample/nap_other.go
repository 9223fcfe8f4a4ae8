//go:build !linux

package sample

// newNapClock returns nil: nap uses Go's timer.
func newNapClock() napClock { return nil }
