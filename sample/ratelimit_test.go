package sample

import (
	"math"
	"testing"
)

func limiter(t *testing.T, rl RateLimit) *RateLimiter {
	t.Helper()
	l, err := NewRateLimiter(rl)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestRateLimiterArithmetic(t *testing.T) {
	rl := RateLimit{SamplesPerInsert: 1.5, MinSize: 3, MinDiff: -2, MaxDiff: 4}
	for _, c := range []struct {
		ins, smp, del int64
		n             int64 // for CanSample; CanInsert is asked for 1
		canSample     bool
		canInsert     bool
	}{
		// size 2 < 3: no sample; 2+1-0 <= 3: the insert is free.
		{2, 0, 0, 1, false, true},
		// 3*1.5-0-1 = 3.5 >= -2: sample; 4 > 3 and 4*1.5-0 = 6 > 4: no insert.
		{3, 0, 0, 1, true, false},
		// 4*1.5-1-7 = -2 >= -2: seven samples allowed, eight not.
		{4, 1, 0, 7, true, false},
		{4, 1, 0, 8, false, false},
		// Deletes take the size below min size.
		{5, 0, 3, 1, false, true},
		// (5+1)*1.5-4 = 5 > 4, but 5+1-3 = 3 <= 3: the insert is free.
		{5, 4, 3, 1, false, true},
		// 7*1.5-6 = 4.5 > 4: no insert; one more sample makes room.
		{6, 6, 0, 1, true, false},
		{6, 7, 0, 1, true, true},
	} {
		l := limiter(t, rl)
		l.SetCounts(c.ins, c.smp, c.del)
		if got := l.CanSample(c.n); got != c.canSample {
			t.Errorf("counts %d/%d/%d: CanSample(%d) = %v", c.ins, c.smp, c.del, c.n, got)
		}
		if got := l.CanInsert(1); got != c.canInsert {
			t.Errorf("counts %d/%d/%d: CanInsert(1) = %v", c.ins, c.smp, c.del, got)
		}
	}
}

func TestRateLimiterMaxSamples(t *testing.T) {
	l := limiter(t, RateLimit{SamplesPerInsert: 0.3, MinSize: 1, MinDiff: -1.1, MaxDiff: 10})
	for ins := int64(0); ins < 40; ins++ {
		for smp := int64(0); smp < 15; smp++ {
			l.SetCounts(ins, smp, 0)
			m := l.MaxSamples(100)
			if m > 0 && !l.CanSample(m) || m < 100 && l.CanSample(m+1) {
				t.Fatalf("counts %d/%d: MaxSamples = %d", ins, smp, m)
			}
		}
	}
	l = limiter(t, MinSize(1))
	l.SetCounts(5, 1e9, 0)
	if m := l.MaxSamples(1 << 40); m != 1<<40 {
		t.Fatalf("MinSize: MaxSamples = %d, want the limit", m)
	}
}

func TestQueueLimiterBlocksFourthInsert(t *testing.T) {
	l := limiter(t, Queue(3))
	if l.CanSample(1) {
		t.Fatal("empty queue allows a sample")
	}
	for i := range 3 {
		if !l.CanInsert(1) {
			t.Fatalf("insert %d refused", i+1)
		}
		l.Insert(1)
	}
	if l.CanInsert(1) {
		t.Fatal("4th insert allowed")
	}
	if !l.CanSample(3) || l.CanSample(4) {
		t.Fatal("a full queue of 3 must allow exactly 3 samples")
	}
	l.Sample(1)
	l.Delete(1) // max_times_sampled 1
	if !l.CanInsert(1) {
		t.Fatal("insert refused after a sample")
	}
}

func TestMinSizeLimiter(t *testing.T) {
	l := limiter(t, MinSize(3))
	for i := range 3 {
		if l.CanSample(1) {
			t.Fatalf("sample allowed at size %d", i)
		}
		l.Insert(1)
	}
	l.Sample(1000)
	if !l.CanSample(1) || !l.CanInsert(1000) {
		t.Fatal("MinSize must not limit once the size is reached")
	}
	l.Delete(1)
	if l.CanSample(1) {
		t.Fatal("sample allowed after the size fell below min size")
	}
}

func TestSampleToInsertRatioPresets(t *testing.T) {
	rl, err := SampleToInsertRatio(2, 10, 5)
	if err != nil {
		t.Fatal(err)
	}
	if rl.MinDiff != 15 || rl.MaxDiff != 25 || rl.MinSize != 10 || rl.SamplesPerInsert != 2 {
		t.Fatalf("got %+v", rl)
	}
	for _, c := range []struct {
		spi, eb float64
		min     int64
	}{
		{2, 1.9, 10},  // window 3.8 < 4
		{0.5, 0.9, 1}, // window 1.8 < 2
		{1, -3, 1},    // negative buffer
		{0, 5, 1},     // spi 0
		{1, 5, 0},     // min size 0
		{math.NaN(), 5, 1},
	} {
		if _, err := SampleToInsertRatio(c.spi, c.min, c.eb); err == nil {
			t.Errorf("SampleToInsertRatio(%v, %d, %v) accepted", c.spi, c.min, c.eb)
		}
	}
	if _, err := SampleToInsertRatio(1, 1, 1); err != nil {
		t.Errorf("window exactly 2: %v", err)
	}
	if q := Queue(4); q != (RateLimit{SamplesPerInsert: 1, MinSize: 1, MinDiff: 0, MaxDiff: 4}) || Stack(4) != q {
		t.Errorf("Queue(4) = %+v", q)
	}
	if m := MinSize(7); m.MinDiff != -math.MaxFloat64 || m.MaxDiff != math.MaxFloat64 || m.SamplesPerInsert != 1 {
		t.Errorf("MinSize(7) = %+v", m)
	}
	if _, err := NewRateLimiter(MinSize(0)); err == nil {
		t.Error("MinSize(0) accepted")
	}
	if _, err := NewRateLimiter(RateLimit{SamplesPerInsert: 1, MinSize: 1, MinDiff: 2, MaxDiff: 1}); err == nil {
		t.Error("min_diff > max_diff accepted")
	}
}

func TestRateLimiterMaxInserts(t *testing.T) {
	for _, rl := range []RateLimit{
		{SamplesPerInsert: 0.7, MinSize: 5, MinDiff: -3, MaxDiff: 6.5},
		Queue(4),
		{SamplesPerInsert: 3, MinSize: 1, MinDiff: 0, MaxDiff: 10},
	} {
		l := limiter(t, rl)
		for ins := int64(0); ins < 30; ins++ {
			for smp := int64(0); smp < 40; smp += 3 {
				for del := int64(0); del <= ins; del += 4 {
					l.SetCounts(ins, smp, del)
					m := l.MaxInserts(1000)
					for n := int64(1); n <= m; n++ {
						if !l.CanInsert(n) {
							t.Fatalf("%+v counts %d/%d/%d: MaxInserts %d but CanInsert(%d) is false", rl, ins, smp, del, m, n)
						}
					}
					if m < 1000 && l.CanInsert(m+1) {
						t.Fatalf("%+v counts %d/%d/%d: MaxInserts %d but CanInsert(%d)", rl, ins, smp, del, m, m+1)
					}
				}
			}
		}
	}
	if m := limiter(t, MinSize(3)).MaxInserts(1 << 40); m != 1<<40 {
		t.Fatalf("MinSize: MaxInserts %d", m)
	}
}
