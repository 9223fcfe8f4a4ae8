package main

import "fmt"

// Placeholder until the launcher lands.

func launchCommand(args []string, s stdio) int { return notYet("launch", s) }
func cleanCommand(args []string, s stdio) int  { return notYet("clean", s) }

func notYet(name string, s stdio) int {
	fmt.Fprintf(s.err, "gearrun: %s: not built yet\n", name)
	return 2
}
