package main

// Placeholder until the GMI commands land.

func gpusCommand(args []string, s stdio) int { return notYet("gpus", s) }
func gmiCommand(args []string, s stdio) int  { return notYet("gmi", s) }
