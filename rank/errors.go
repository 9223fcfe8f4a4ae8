package rank

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

var (
	// ErrClosed is returned by World methods after Close.
	ErrClosed = errors.New("rank: world closed")
	// ErrTokenRefused is returned by Init when the coordinator refuses the job
	// token's proof, or when the coordinator cannot prove that it knows the token.
	ErrTokenRefused = errors.New("rank: job token refused")
	// ErrCoordinatorGone is returned by World methods when the connection to the
	// coordinator broke (the launcher ended or died).
	ErrCoordinatorGone = errors.New("rank: coordinator connection lost")
	// ErrKeyExists is returned by Set for a key that was already set.
	ErrKeyExists = errors.New("rank: key already set")
	// ErrRankLost is matched (errors.Is) by every *LostError.
	ErrRankLost = errors.New("rank: rank lost")
	// ErrRendezvous is matched (errors.Is) by every *RendezvousError.
	ErrRendezvous = errors.New("rank: rendezvous failed")
)

// LostError says that a rank of the world died or left, so that collectives and
// barriers that need it cannot complete.
type LostError struct {
	Rank   int
	Reason string
	// Host names the node the rank ran on (rank.HostName of its host
	// identity); "" when unknown.
	Host string
}

func (e *LostError) Error() string {
	if e.Host != "" {
		return fmt.Sprintf("rank: rank %d on %s lost: %s", e.Rank, e.Host, e.Reason)
	}
	return fmt.Sprintf("rank: rank %d lost: %s", e.Rank, e.Reason)
}

// Is makes errors.Is(err, ErrRankLost) true.
func (e *LostError) Is(target error) bool { return target == ErrRankLost }

// RendezvousError says that the world could not assemble: the ranks in Missing
// never joined (within the timeout, or because one of them ended first).
type RendezvousError struct {
	Missing []int
	Reason  string
}

func (e *RendezvousError) Error() string {
	if len(e.Missing) == 0 {
		return "rank: rendezvous failed: " + e.Reason
	}
	word := "ranks"
	if len(e.Missing) == 1 {
		word = "rank"
	}
	return fmt.Sprintf("rank: rendezvous failed: %s %s never joined: %s", word, FormatRanks(e.Missing), e.Reason)
}

// Is makes errors.Is(err, ErrRendezvous) true.
func (e *RendezvousError) Is(target error) bool { return target == ErrRendezvous }

// FormatRanks writes a sorted list of ranks compactly: "0-3,7,9-10".
func FormatRanks(ranks []int) string {
	var b strings.Builder
	for i := 0; i < len(ranks); {
		j := i
		for j+1 < len(ranks) && ranks[j+1] == ranks[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(ranks[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(ranks[j]))
		}
		i = j + 1
	}
	return b.String()
}
