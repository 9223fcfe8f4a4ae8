package collective

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Errors returned by a communicator wrap one of these or the
// context's error, and name their cause.
var (
	// ErrClosed: the communicator was closed.
	ErrClosed = errors.New("collective: communicator closed")
	// ErrMismatch: ranks called different collectives, or the same collective with
	// different element types, counts, reductions or roots (*MismatchError).
	ErrMismatch = errors.New("collective: mismatched calls")
	// ErrRankLost: a rank of the communicator died or its connection broke
	// (*LostError).
	ErrRankLost = errors.New("collective: rank lost")
	// ErrAborted: another rank's communicator failed; the error carries its cause
	// (*AbortError).
	ErrAborted = errors.New("collective: aborted")
)

// errStopped is what a link returns when the communicator's signals stopped a wait;
// the communicator replaces it with the cause.
var errStopped = errors.New("collective: stopped")

// MismatchError says that two ranks called different collectives. Every rank of the
// communicator gets it, with the same text, naming both calls.
type MismatchError struct {
	Rank     int    // the rank that noticed (communicator rank)
	Call     string // its call, e.g. "AllReduce(sum, float32, 100 elements) as call 7"
	PeerRank int    // the rank whose frame belonged to another call
	PeerCall string // that rank's call
	Detail   string // what differs, when it is not the call itself
}

func (e *MismatchError) Error() string {
	// The lower rank first, so that the two ranks that notice the same
	// mismatch, each from its side, say it in the same words.
	r, call, pr, pcall := e.Rank, e.Call, e.PeerRank, e.PeerCall
	if pr < r {
		r, call, pr, pcall = pr, pcall, r, call
	}
	s := fmt.Sprintf("collective: mismatched calls: rank %d called %s but rank %d called %s", r, call, pr, pcall)
	if e.Detail != "" {
		s += " (" + e.Detail + ")"
	}
	return s
}

// Is makes errors.Is(err, ErrMismatch) true.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// LostError says that a rank of the communicator died or became unreachable.
type LostError struct {
	Rank      int // communicator rank
	WorldRank int
	Reason    string
	// Host names the rank's host when the communicator spans several ("n2");
	// "" otherwise.
	Host string
}

func (e *LostError) Error() string {
	who := fmt.Sprintf("rank %d", e.Rank)
	if e.WorldRank != e.Rank {
		who += fmt.Sprintf(" (world rank %d)", e.WorldRank)
	}
	if e.Host != "" {
		who += " on " + e.Host
	}
	if e.Reason == "" {
		return "collective: lost " + who
	}
	return "collective: lost " + who + ": " + e.Reason
}

// Is makes errors.Is(err, ErrRankLost) true.
func (e *LostError) Is(target error) bool { return target == ErrRankLost }

// AbortError is what the other ranks get when one rank's communicator fails for a
// reason of its own (its context ended, it was given a bad argument).
type AbortError struct {
	Rank  int    // the rank whose communicator failed first
	Cause string // that rank's error
}

func (e *AbortError) Error() string {
	return fmt.Sprintf("collective: rank %d failed: %s", e.Rank, e.Cause)
}

// Is makes errors.Is(err, ErrAborted) true.
func (e *AbortError) Is(target error) bool { return target == ErrAborted }

// EncodeAbortNote is the notice by which communicator rank from tells the
// other ranks why its communicator failed with err, the way Comm publishes it
// under its bootstrap key "collective/<Name>/abort". It is for packages that
// build communicators with Comm's error semantics on other links (package
// github.com/gear-rl/gear/collective/nccl); DecodeAbortNote reads it back.
func EncodeAbortNote(from int, err error) []byte { return encodeAbort(from, err) }

// DecodeAbortNote is the error a rank returns on hearing the notice b of
// EncodeAbortNote: the same *MismatchError or *LostError, or *AbortError naming
// the rank that failed first and its cause (also for a notice it cannot read).
func DecodeAbortNote(b []byte) error { return decodeAbort(b) }

// abortNote is how a failure travels to the other ranks (through the bootstrap).
type abortNote struct {
	Type     string `json:"type"` // "mismatch", "lost" or "abort"
	From     int    `json:"from"`
	Rank     int    `json:"rank,omitempty"`
	World    int    `json:"world,omitempty"`
	Call     string `json:"call,omitempty"`
	PeerRank int    `json:"peer_rank,omitempty"`
	PeerCall string `json:"peer_call,omitempty"`
	Detail   string `json:"detail,omitempty"`
	Cause    string `json:"cause,omitempty"`
	Host     string `json:"host,omitempty"`
}

func encodeAbort(from int, err error) []byte {
	n := abortNote{Type: "abort", From: from, Cause: err.Error()}
	var me *MismatchError
	var le *LostError
	var ae *AbortError
	switch {
	case errors.As(err, &me):
		n = abortNote{Type: "mismatch", From: from, Rank: me.Rank, Call: me.Call, PeerRank: me.PeerRank, PeerCall: me.PeerCall, Detail: me.Detail}
	case errors.As(err, &le):
		n = abortNote{Type: "lost", From: from, Rank: le.Rank, World: le.WorldRank, Cause: le.Reason, Host: le.Host}
	case errors.As(err, &ae):
		n = abortNote{Type: "abort", From: ae.Rank, Cause: ae.Cause}
	}
	b, _ := json.Marshal(n)
	return b
}

func decodeAbort(b []byte) error {
	var n abortNote
	if err := json.Unmarshal(b, &n); err != nil {
		return &AbortError{Rank: -1, Cause: fmt.Sprintf("unreadable failure notice %q", b)}
	}
	switch n.Type {
	case "mismatch":
		return &MismatchError{Rank: n.Rank, Call: n.Call, PeerRank: n.PeerRank, PeerCall: n.PeerCall, Detail: n.Detail}
	case "lost":
		return &LostError{Rank: n.Rank, WorldRank: n.World, Reason: n.Cause, Host: n.Host}
	}
	return &AbortError{Rank: n.From, Cause: n.Cause}
}

// fitNote shortens a note of encodeAbort to at most limit bytes, if it is
// longer, by cutting its longest texts (ending them with "..."), so that it
// stays readable where it must fit (a shared-memory inbox).
func fitNote(note []byte, limit int) []byte {
	if len(note) <= limit {
		return note
	}
	var n abortNote
	if json.Unmarshal(note, &n) != nil {
		return nil
	}
	for range 64 {
		fields := []*string{&n.Cause, &n.Detail, &n.Call, &n.PeerCall, &n.Host}
		longest := fields[0]
		for _, f := range fields[1:] {
			if len(*f) > len(*longest) {
				longest = f
			}
		}
		if len(*longest) <= 8 {
			break
		}
		*longest = strings.ToValidUTF8((*longest)[:len(*longest)/2], "") + "..."
		if b, err := json.Marshal(n); err == nil && len(b) <= limit {
			return b
		}
	}
	return nil
}
