package sample

import (
	"fmt"
	"math"

	"github.com/gear-rl/gear/sample/reverb"
)

// RateLimit configures a rate limiter with Reverb's four parameters. The counts it
// watches are inserts (new items; an insert of an existing key that only updates
// its priority does not count), samples (sampled items) and deletes (items removed
// for any reason), so inserts - deletes is the table's size.
//
//	CanSample(n): inserts - deletes >= MinSize  AND
//	              inserts*SamplesPerInsert - samples - n >= MinDiff
//	CanInsert(n): inserts + n - deletes <= MinSize  OR
//	              (inserts + n)*SamplesPerInsert - samples <= MaxDiff
type RateLimit struct {
	// SamplesPerInsert is the target ratio of samples to inserts (> 0).
	SamplesPerInsert float64 `toml:"samples_per_insert"`
	// MinSize is the number of items the table must hold before sampling (>= 1).
	MinSize int64 `toml:"min_size"`
	// MinDiff and MaxDiff bound inserts*SamplesPerInsert - samples.
	MinDiff float64 `toml:"min_diff"`
	MaxDiff float64 `toml:"max_diff"`
}

// MinSize blocks samples until the table holds k items and otherwise never blocks:
// samples per insert 1, diffs -/+ the largest float64.
func MinSize(k int64) RateLimit { return RateLimit(reverb.MinSizeLimit(k)) }

// SampleToInsertRatio keeps samples/inserts near spi once the table holds minSize
// items: the diffs are spi*minSize -/+ errorBuffer. It is refused when the
// window max_diff - min_diff is narrower than 2*max(1, spi), which could block
// both sides, or when min_diff > spi*minSize.
func SampleToInsertRatio(spi float64, minSize int64, errorBuffer float64) (RateLimit, error) {
	offset := spi * float64(minSize)
	rl := RateLimit(reverb.RatioLimit(spi, minSize, errorBuffer))
	if err := rl.Validate(); err != nil {
		return RateLimit{}, err
	}
	if w := rl.MaxDiff - rl.MinDiff; w < reverb.MinRatioWindow(spi) {
		return RateLimit{}, fmt.Errorf("sample: SampleToInsertRatio: error_buffer %v: the window max_diff - min_diff = %v is under 2*max(1, samples_per_insert) = %v and could block both inserts and samples", errorBuffer, w, reverb.MinRatioWindow(spi))
	}
	if rl.MinDiff > offset {
		return RateLimit{}, fmt.Errorf("sample: SampleToInsertRatio: min_diff %v exceeds samples_per_insert*min_size = %v", rl.MinDiff, offset)
	}
	return rl, nil
}

// Queue lets n items wait between inserts and samples: samples per insert 1, min
// size 1, diffs [0, n]. With FIFO selectors and max_times_sampled 1 the table is a
// queue of n items.
func Queue(n int64) RateLimit { return RateLimit(reverb.QueueLimit(1, n)) }

// Stack is Queue's limiter; with LIFO selectors and max_times_sampled 1 the table is
// a stack of n items.
func Stack(n int64) RateLimit { return Queue(n) }

// Validate names the first bad field.
func (rl RateLimit) Validate() error {
	switch {
	case !(rl.SamplesPerInsert > 0) || math.IsInf(rl.SamplesPerInsert, 0):
		return fmt.Errorf("sample: rate limit: samples_per_insert %v: want a finite number > 0", rl.SamplesPerInsert)
	case rl.MinSize < 1:
		return fmt.Errorf("sample: rate limit: min_size %d: want >= 1", rl.MinSize)
	case math.IsNaN(rl.MinDiff) || math.IsNaN(rl.MaxDiff):
		return fmt.Errorf("sample: rate limit: min_diff %v, max_diff %v: NaN", rl.MinDiff, rl.MaxDiff)
	case rl.MinDiff > rl.MaxDiff:
		return fmt.Errorf("sample: rate limit: min_diff %v exceeds max_diff %v", rl.MinDiff, rl.MaxDiff)
	}
	return nil
}

// RateLimiter is the synchronous core of rate limiting: a RateLimit and the three
// counts. It never blocks; the table waits on it. It is not safe for concurrent
// use.
type RateLimiter struct {
	cfg                       RateLimit
	inserts, samples, deletes int64
}

// NewRateLimiter returns a limiter with zero counts.
func NewRateLimiter(cfg RateLimit) (*RateLimiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &RateLimiter{cfg: cfg}, nil
}

// Config is the limiter's RateLimit.
func (l *RateLimiter) Config() RateLimit { return l.cfg }

// CanSample reports whether n more samples are allowed now.
func (l *RateLimiter) CanSample(n int64) bool {
	if l.inserts-l.deletes < l.cfg.MinSize {
		return false
	}
	return float64(l.inserts)*l.cfg.SamplesPerInsert-float64(l.samples)-float64(n) >= l.cfg.MinDiff
}

// CanInsert reports whether n more inserts are allowed now.
func (l *RateLimiter) CanInsert(n int64) bool {
	if l.inserts+n-l.deletes <= l.cfg.MinSize {
		return true
	}
	return float64(l.inserts+n)*l.cfg.SamplesPerInsert-float64(l.samples) <= l.cfg.MaxDiff
}

// MaxSamples is the largest n <= limit for which CanSample(n) holds (0 when
// none).
func (l *RateLimiter) MaxSamples(limit int64) int64 {
	if limit <= 0 || !l.CanSample(1) {
		return 0
	}
	if l.CanSample(limit) {
		return limit
	}
	room := float64(l.inserts)*l.cfg.SamplesPerInsert - float64(l.samples) - l.cfg.MinDiff
	n := min(max(int64(room), 1), limit)
	for n > 1 && !l.CanSample(n) { // float rounding
		n--
	}
	for n < limit && l.CanSample(n+1) {
		n++
	}
	return n
}

// MaxInserts is the largest n <= limit for which CanInsert(n) holds (0 when
// none). CanInsert(n) holds for every n up to it.
func (l *RateLimiter) MaxInserts(limit int64) int64 {
	if limit <= 0 {
		return 0
	}
	if l.CanInsert(limit) {
		return limit
	}
	free := l.cfg.MinSize - (l.inserts - l.deletes) // inserts that keep the size at most MinSize
	room := (l.cfg.MaxDiff+float64(l.samples))/l.cfg.SamplesPerInsert - float64(l.inserts)
	n := free
	if room > float64(n) {
		n = int64(min(room, float64(limit)))
	}
	n = min(max(n, 0), limit)
	for n > 0 && !l.CanInsert(n) { // float rounding
		n--
	}
	for n < limit && l.CanInsert(n+1) {
		n++
	}
	return n
}

// Insert counts n inserts.
func (l *RateLimiter) Insert(n int64) { l.inserts += n }

// Sample counts n samples.
func (l *RateLimiter) Sample(n int64) { l.samples += n }

// Delete counts n deletes.
func (l *RateLimiter) Delete(n int64) { l.deletes += n }

// Reset zeroes the counts.
func (l *RateLimiter) Reset() { l.inserts, l.samples, l.deletes = 0, 0, 0 }

// Counts returns inserts, samples and deletes.
func (l *RateLimiter) Counts() (inserts, samples, deletes int64) {
	return l.inserts, l.samples, l.deletes
}

// SetCounts replaces the counts (the distributed table keeps them global).
func (l *RateLimiter) SetCounts(inserts, samples, deletes int64) {
	l.inserts, l.samples, l.deletes = inserts, samples, deletes
}

// LimiterInfo is a rate limiter's configuration, counts and current verdicts.
type LimiterInfo struct {
	RateLimit
	Inserts, Samples, Deletes int64
	CanSample, CanInsert      bool
}

// Info reports the limiter's state.
func (l *RateLimiter) Info() LimiterInfo {
	return LimiterInfo{RateLimit: l.cfg, Inserts: l.inserts, Samples: l.samples, Deletes: l.deletes,
		CanSample: l.CanSample(1), CanInsert: l.CanInsert(1)}
}
