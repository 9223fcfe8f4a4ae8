// Package futex wraps the Linux futex calls that the shared-memory transports
// of collective and roles sleep and wake on.
//
// The words live in shared memory and the waiters are in other processes, so
// the operations are the shared ones (no FUTEX_PRIVATE_FLAG). A caller keeps its
// condition in shared memory next to the word: it rechecks the condition after
// every Wait, since Wait may return early (a wake, a signal, the timeout, or a
// word that had already changed), and it changes the word before it calls Wake.
// Elsewhere than on Linux, Wait sleeps a little and Wake does nothing, so that
// callers that poll still make progress.
package futex
