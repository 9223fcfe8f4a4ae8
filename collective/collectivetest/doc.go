// Package collectivetest helps test code that uses package collective: an
// in-process Bootstrap (World) whose ranks are goroutines, and Run, which builds an
// n-rank world of communicators over a chosen transport, runs a function on every
// rank at once, and closes everything, checking that nothing is left behind in
// /dev/shm.
//
// In order, by hand: NewWorld(n), then one collective.New per rank, each on its own
// goroutine, with w.Bootstrap(rank) (and collective.WithLoopback for the in-process
// transport); Lose(rank, reason) plays the coordinator's news of a dead rank. Or:
// Comms(t, n, cfg) builds the world's communicators over cfg.Transport and closes
// them when the test ends; Each runs a function on every rank at once; Run does
// both.
package collectivetest
