package rank

import (
	"log/slog"
	"sync"
	"time"
)

// refusalLogBurst is how many refused connections the coordinator logs a second;
// the rest are counted, and the count is logged with the next refusal it logs
// (or when it closes), so that a flood of hostile connections cannot flood the
// launcher's log.
const refusalLogBurst = 10

// refusalLog logs refused connections at Warn, rate-limited.
type refusalLog struct {
	log *slog.Logger

	mu         sync.Mutex
	window     time.Time // start of the current second
	logged     int       // refusals logged in it
	suppressed int       // refusals not logged since the last one logged
}

// warn logs that the connection from remote ("" when there is none) was
// refused, and why.
func (l *refusalLog) warn(remote, reason string) {
	now := time.Now()
	l.mu.Lock()
	if now.Sub(l.window) >= time.Second {
		l.window, l.logged = now, 0
	}
	if l.logged >= refusalLogBurst {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	l.logged++
	more := l.suppressed
	l.suppressed = 0
	l.mu.Unlock()
	args := []any{"remote", remote, "reason", reason}
	if more > 0 {
		args = append(args, "unlogged_before", more)
	}
	l.log.Warn("rank: coordinator: refused connection", args...)
}

// flush logs how many refusals were not logged, if any.
func (l *refusalLog) flush() {
	l.mu.Lock()
	more := l.suppressed
	l.suppressed = 0
	l.mu.Unlock()
	if more > 0 {
		l.log.Warn("rank: coordinator: more refused connections were not logged", "count", more)
	}
}
