// Package collective implements communicators and their blocking collectives over
// pluggable transports (in-process, shared memory, TCP, NCCL).
package collective
