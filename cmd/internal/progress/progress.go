// Package progress shows the progress of long shard operations (checkpoints,
// restores) as a bar on a terminal, and nothing anywhere else. It serves gear's
// commands; the store package only reports progress (store.WithProgress).
//
// A command passes Bar's report function to store.WithProgress and calls finish
// when the operation returns:
//
//	report, finish := progress.Bar(os.Stderr, "checkpoint")
//	err := shard.Checkpoint(ctx, path, store.WithProgress(report))
//	finish()
package progress

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// Bar returns a progress callback (bytes done, bytes in all) that draws a bar on f
// when f is a terminal, and finish, which ends the bar's line. When f is not a
// terminal both do nothing, so that logs and JSON output stay clean.
func Bar(f *os.File, description string) (report func(done, total int64), finish func()) {
	if f == nil || !term.IsTerminal(int(f.Fd())) {
		return func(int64, int64) {}, func() {}
	}
	return New(f, description)
}

// New is Bar without the terminal check: it draws on any writer.
func New(w io.Writer, description string) (report func(done, total int64), finish func()) {
	var bar *progressbar.ProgressBar
	report = func(done, total int64) {
		if bar == nil {
			bar = progressbar.NewOptions64(total,
				progressbar.OptionSetWriter(w),
				progressbar.OptionSetDescription(description),
				progressbar.OptionShowBytes(true),
				progressbar.OptionShowTotalBytes(true),
				progressbar.OptionShowCount(),
				progressbar.OptionSetWidth(30),
				progressbar.OptionThrottle(100*time.Millisecond),
				progressbar.OptionSetPredictTime(true),
				progressbar.OptionOnCompletion(func() { io.WriteString(w, "\n") }),
			)
		}
		_ = bar.Set64(done)
	}
	finish = func() {
		if bar != nil && !bar.IsFinished() {
			_ = bar.Finish()
		}
	}
	return report, finish
}
