// Package jobs decodes and validates TOML job specs and drives SLURM (batch scripts,
// submit, status, cancel, logs).
package jobs
