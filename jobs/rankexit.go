package jobs

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
)

func (e RankExit) String() string {
	who := fmt.Sprintf("rank %d", e.Rank)
	if e.Role != "" {
		who += fmt.Sprintf(" (%s %d)", e.Role, e.RoleRank)
	}
	if e.Host != "" {
		who += " on " + e.Host
	}
	if e.Signal != "" {
		return who + " was killed by signal " + e.Signal
	}
	return fmt.Sprintf("%s exited with status %d", who, e.Status)
}

// killedWindow is how close to the earliest failure a rank killed by a signal
// must be for firstFailure to name it instead.
const killedWindow = time.Second

// firstFailure is the failure that gearrun names, of exits sorted earliest
// first: the earliest, unless a rank was killed by a signal within
// killedWindow of it. The ranks that lose a peer fail within milliseconds of
// its death, and one of them may report before the dead rank's own task has
// reaped it; the killed rank is the cause.
func firstFailure(exits []RankExit) RankExit {
	for _, e := range exits {
		if e.At.Sub(exits[0].At) > killedWindow {
			break
		}
		if e.Signal != "" {
			return e
		}
	}
	return exits[0]
}

// readRankExits reads the ranks' exit records, earliest first.
func readRankExits(dir string) []RankExit {
	if dir == "" {
		return nil
	}
	entries, _ := os.ReadDir(filepath.Join(dir, RanksDir))
	var out []RankExit
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, RanksDir, e.Name()))
		if err != nil {
			continue
		}
		var re RankExit
		if json.Unmarshal(b, &re) == nil {
			out = append(out, re)
		}
	}
	slices.SortStableFunc(out, func(a, b RankExit) int {
		if c := a.At.Compare(b.At); c != 0 {
			return c
		}
		return a.Rank - b.Rank
	})
	return out
}
