package clock

import (
	"testing"
	"time"
)

func TestNilIsTheWallClock(t *testing.T) {
	var c Clock
	before := time.Now()
	got := c.Now()
	if got.Before(before) || got.After(time.Now()) {
		t.Fatalf("nil Clock.Now() = %v, want a time between %v and now", got, before)
	}
}

func TestNowCallsTheFake(t *testing.T) {
	at := time.Date(2001, 2, 3, 4, 5, 6, 7, time.UTC)
	calls := 0
	c := Clock(func() time.Time { calls++; return at })
	if got := c.Now(); !got.Equal(at) || calls != 1 {
		t.Fatalf("Now() = %v after %d calls, want %v after 1", got, calls, at)
	}
}

func TestNowAllocatesNothing(t *testing.T) {
	var wall Clock
	at := time.Unix(1, 0)
	fake := Clock(func() time.Time { return at })
	for _, c := range []Clock{wall, fake} {
		if n := testing.AllocsPerRun(100, func() { _ = c.Now() }); n != 0 {
			t.Errorf("Now() allocates %v times per call, want 0", n)
		}
	}
}
