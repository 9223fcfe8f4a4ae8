package rank

import (
	"log/slog"
	"os"
	"strconv"

	"github.com/gear-rl/gear/internal/metrics"
)

// openMetrics makes and publishes the metrics segment of a rank that a
// launcher started (fromEnv: its place came from the environment, by gearrun
// or SLURM), so that gearrun top, --metrics-addr and --trace see it; the
// launcher removes it with the job's other segments, in the directory it
// names in EnvMetricsDir. A process alone, a world
// given WithInfo (in-process worlds of tests) and a process that already
// published one get none. A failure costs the rank its metrics, not its run.
func openMetrics(fromEnv bool, info Info, log *slog.Logger) *metrics.Rank {
	if !fromEnv || info.Source == SourceSingle || metrics.Current() != nil {
		return nil
	}
	n := 0
	if v := os.Getenv(EnvTraceEvents); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 0 {
			log.Warn("rank: no trace", "err", "bad "+EnvTraceEvents+"="+strconv.Quote(v))
			n = 0
		}
		n = min(n, metrics.MaxTraceEvents)
	}
	r, err := metrics.Open(metrics.Place{Job: info.JobID, Rank: info.Rank, Size: info.Size,
		Generation: info.Restart, Role: info.Role, TraceEvents: n, Dir: os.Getenv(EnvMetricsDir)})
	if err != nil {
		log.Warn("rank: no metrics", "err", err)
		return nil
	}
	metrics.Publish(r)
	return r
}
