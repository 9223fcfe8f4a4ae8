package roles

import (
	"errors"
	"fmt"

	"github.com/gear-rl/gear/rank"
)

var (
	// ErrClosed is returned by the methods of a server, client, publisher, reader,
	// sender or receiver after its Close.
	ErrClosed = errors.New("roles: closed")
	// ErrPeerClosed is matched (errors.Is) by the error a client gets when the
	// other end closed the stream on purpose (the policy worker, trainer or
	// publisher called Close).
	ErrPeerClosed = errors.New("roles: stream closed by its owner")
	// ErrLost is matched (errors.Is) by every *LostError.
	ErrLost = errors.New("roles: peer lost")
	// ErrStaleVersion is returned by Publisher.Publish for a version that is not
	// greater than the last one published.
	ErrStaleVersion = errors.New("roles: parameter version not newer than the last published")
	// ErrTooLarge is returned for an observation, action or record that does not
	// fit the stream's configured sizes.
	ErrTooLarge = errors.New("roles: message too large for the stream")
	// ErrNoSlot is returned by DialInference and DialSamples when every
	// shared-memory slot of the server is taken.
	ErrNoSlot = errors.New("roles: no free shared-memory slot")
	// ErrInvalid is matched (errors.Is) by the error of an argument the
	// package refuses: a stream name, a parameter count.
	ErrInvalid = errors.New("roles: invalid argument")
)

// LostError says that the rank at the other end of a stream died: the world's
// coordinator reported it, its connection broke, or its shared-memory segment lost
// its owner. Role says what the rank was to the caller ("policy worker",
// "trainer", "parameter publisher").
type LostError struct {
	Role   string
	Rank   int
	Reason string
}

func (e *LostError) Error() string {
	return fmt.Sprintf("roles: %s rank %d lost: %s", e.Role, e.Rank, e.Reason)
}

// Is makes errors.Is(err, ErrLost) and errors.Is(err, rank.ErrRankLost) true.
func (e *LostError) Is(target error) bool { return target == ErrLost || target == rank.ErrRankLost }

// peerClosed is the error a client gets when role rank r closed the stream.
func peerClosed(role string, r int, stream string) error {
	return fmt.Errorf("roles: %s rank %d closed stream %q: %w", role, r, stream, ErrPeerClosed)
}

// Role names used in errors.
const (
	rolePolicy    = "policy worker"
	roleTrainer   = "trainer"
	rolePublisher = "parameter publisher"
)
