package main

// Placeholder until the job-spec commands land.

func runJobCommand(args []string, s stdio) int   { return notYet("run", s) }
func validateCommand(args []string, s stdio) int { return notYet("validate", s) }
func submitCommand(args []string, s stdio) int   { return notYet("submit", s) }
func statusCommand(args []string, s stdio) int   { return notYet("status", s) }
func cancelCommand(args []string, s stdio) int   { return notYet("cancel", s) }
func logsCommand(args []string, s stdio) int     { return notYet("logs", s) }
