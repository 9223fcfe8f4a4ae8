// Package launchtest starts real rank processes from a Go test: the test binary
// re-executes itself as the ranks of one job under launch.Run, and each copy runs
// only the calling test's rank function.
//
//	func TestAllReduce(t *testing.T) {
//		launchtest.RunRanks(t, 4, func(t *testing.T, w *rank.World) {
//			// runs in each of the 4 rank processes, with its own World
//		})
//	}
//
// In the launching process RunRanks builds a plan whose ranks run the test binary
// with -test.run selecting this test and GEAR_TEST_RANK naming the call; it runs
// the plan, and fails the test (with every rank's tagged output) unless every
// rank exits 0. In a rank process RunRanks joins the world, calls fn, closes the
// world and returns; t's failures become the rank's exit status. Code of the test
// outside fn runs in the ranks too, so keep it cheap or guard it with IsRank.
package launchtest
