// Package geartest holds the test helpers that the tests of several gear
// packages share; nothing outside tests imports it.
//
// A Buffer collects the output of processes or loggers that write from other
// goroutines while the test reads it. Commands builds Go commands (such as
// gearrun) once per test binary, for tests that run them as real processes:
//
//	var bins = geartest.NewCommands("github.com/gear-rl/gear/cmd/gearrun")
//
//	func TestMain(m *testing.M) {
//		code := m.Run()
//		bins.Remove()
//		os.Exit(code)
//	}
//
//	func TestSomething(t *testing.T) {
//		gearrun := bins.Path(t, "gearrun")
//		...
//	}
package geartest
