package main

import "fmt"

// notYet answers a subcommand that is not built yet.
func notYet(name string, s stdio) int {
	fmt.Fprintf(s.err, "gearrun: %s: not built yet\n", name)
	return 2
}
