package launch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gear-rl/gear/internal/metrics"
	"github.com/gear-rl/gear/rank"
)

// DefaultTraceEvents is how many events each rank keeps for a job's trace
// when Options.TraceEvents is 0: about 48 bytes each.
const DefaultTraceEvents = 1 << 16

// metricsEnv returns env with rank.EnvMetricsDir set to shmDir, where the
// launcher reads and removes the ranks' metrics segments, and
// rank.EnvTraceEvents set for a job with a trace (file not empty), and
// without it otherwise, so that a launcher's own settings do not reach the
// ranks.
func metricsEnv(env []string, shmDir, file string, events int) []string {
	env = slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		return strings.HasPrefix(kv, rank.EnvTraceEvents+"=") || strings.HasPrefix(kv, rank.EnvMetricsDir+"=")
	})
	if shmDir != "" {
		env = append(env, rank.EnvMetricsDir+"="+shmDir)
	}
	if file == "" {
		return env
	}
	if events <= 0 {
		events = DefaultTraceEvents
	}
	return append(env, rank.EnvTraceEvents+"="+strconv.Itoa(min(events, metrics.MaxTraceEvents)))
}

// WriteTrace writes the Chrome trace of job jobID, merged from its ranks'
// metrics segments in shmDir ("": /dev/shm), to file, replacing it, and
// returns the number of events written. Perfetto and chrome://tracing open
// the file.
func WriteTrace(file, shmDir, jobID string) (int, error) {
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".*")
	if err != nil {
		return 0, fmt.Errorf("launch: trace: %w", err)
	}
	n, err := metrics.WriteTrace(tmp, shmDir, jobID)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), file)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return 0, fmt.Errorf("launch: trace %s: %w", file, err)
	}
	return n, nil
}

// writeTrace writes the job's trace, if asked, before its segments go, and
// says where: from the segments of the earlier generations, which
// dropGeneration moved into traceDir, and of the last.
func (j *job) writeTrace() {
	if j.opts.Trace == "" {
		return
	}
	if j.traceDir == "" {
		j.writeTraceFrom(j.opts.ShmDir)
		return
	}
	defer os.RemoveAll(j.traceDir)
	if err := retireMetrics(j.opts.ShmDir, j.plan.JobID, -1, nil, j.traceDir); err != nil {
		j.log.Warn("launch: copying the last generation's metrics segments for the trace", "err", err)
	}
	j.writeTraceFrom(j.traceDir)
}

// retireMetrics removes the metrics segments of job jobID in shmDir ("":
// /dev/shm) of generation gen (-1: every one) and of the ranks in ranks
// (nil: every rank), whose processes have ended; where copyDir is not "",
// it first copies each into copyDir, for the job's trace. A generation's
// segments go when it ends, so that a job's shared memory does not grow
// with its restarts, and its trace still has every generation.
func retireMetrics(shmDir, jobID string, gen int, ranks []int, copyDir string) error {
	segs, err := metrics.Segments(shmDir, jobID)
	if err != nil {
		return err
	}
	var errs []error
	for _, sg := range segs {
		if gen >= 0 && sg.Gen != gen || ranks != nil && !slices.Contains(ranks, sg.Rank) {
			continue
		}
		if copyDir != "" {
			data, err := os.ReadFile(sg.Path)
			if err == nil {
				err = os.WriteFile(filepath.Join(copyDir, filepath.Base(sg.Path)), data, 0o600)
			}
			if err != nil {
				errs = append(errs, err) // kept where it is: the trace's end reads it there
				continue
			}
		}
		if err := os.Remove(sg.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// writeTraceFrom writes the job's trace from the metrics segments in dir.
func (j *job) writeTraceFrom(dir string) {
	n, err := WriteTrace(j.opts.Trace, dir, j.plan.JobID)
	if err != nil {
		j.stderr.write([]byte(fmt.Sprintf("%s: %s\n", j.opts.Name, strings.TrimPrefix(err.Error(), "launch: "))))
		return
	}
	j.stderr.write([]byte(fmt.Sprintf("%s: trace of %d events in %s (open it in Perfetto or chrome://tracing)\n", j.opts.Name, n, j.opts.Trace)))
}
