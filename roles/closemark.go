package roles

import (
	"context"
	"time"

	"github.com/gear-rl/gear/collective"
)

// A server that closes its stream says so under its endpoint's key plus
// "/closed" in the world's store, before it stops listening, so that a client
// that never reached it (a reader that had not fetched yet, a client dialling
// after the Close) learns that it closed on purpose (ErrPeerClosed) instead of
// taking its refused connection for a lost server. Connected clients learn it
// from the stream itself (the goodbye, the segment's closed flag).

// closeMark is a server's mark: the world and its endpoint's key, once the
// endpoint is published.
type closeMark struct {
	b   collective.Bootstrap
	key string
}

// markDeadline bounds how long a Close waits for the world's store.
const markDeadline = 2 * time.Second

// closedProbe bounds how long a client whose connection failed looks for the
// mark: a failed connection is the only time it looks, and a server that is
// gone without a Close leaves none.
const closedProbe = 200 * time.Millisecond

func closedKey(key string) string { return key + "/closed" }

// set leaves the mark (a server's Close, once). A store that cannot take it
// (the world ending) leaves the clients with the error of a lost server,
// which they would have had anyway.
func (m closeMark) set() {
	if m.b == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), markDeadline)
	defer cancel()
	_ = m.b.Set(ctx, closedKey(m.key), []byte("closed"))
}

// serverClosed reports whether the server of endpoint key left its mark,
// looking for up to closedProbe (less if ctx ends first).
func serverClosed(ctx context.Context, b collective.Bootstrap, key string) bool {
	if b == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, closedProbe)
	defer cancel()
	_, err := b.Wait(ctx, closedKey(key))
	return err == nil
}
