package main

import (
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gear-rl/gear/examples/dqn/internal/plot"
)

// plotCurve draws the learning curve of o.plot (a CSV that --curve wrote) as a
// PNG: the episode returns, their running mean and the target 475, by frames;
// with o.compare, another run's running mean beside it.
func plotCurve(o *options, stdout, stderr io.Writer) int {
	out := o.plotOut
	if out == "" {
		out = strings.TrimSuffix(o.plot, filepath.Ext(o.plot)) + ".png"
	}
	chart, err := readCurve(o.plot)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if o.label != "" {
		chart.MeanLabel = o.label
	}
	said := chart.Subtitle // the subtitle and the other runs' final means
	if len(o.compare) > plot.MaxCompare {
		fmt.Fprintf(stderr, "dqn: plot: %d --compare curves, at most %d\n", len(o.compare), plot.MaxCompare)
		return 2
	}
	for i, path := range o.compare {
		other, err := readCurve(path)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		label := filepath.Base(path)
		if i < len(o.compareLabel) {
			label = o.compareLabel[i]
		}
		chart.Compare = append(chart.Compare, plot.Series{Label: label, Points: other.Points})
		said += "; " + label + ": " + other.Subtitle[strings.LastIndex(other.Subtitle, "final mean"):]
	}
	f, err := os.Create(out)
	if err != nil {
		fmt.Fprintf(stderr, "dqn: plot: %v\n", err)
		return 1
	}
	err = plot.WritePNG(f, chart)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintf(stderr, "dqn: plot: %v\n", err)
		os.Remove(out)
		return 1
	}
	fmt.Fprintf(stdout, "dqn: plot: %s: %s\n", out, said)
	return 0
}

// readCurve reads a learning curve written by --curve into a chart.
func readCurve(path string) (plot.Chart, error) {
	f, err := os.Open(path)
	if err != nil {
		return plot.Chart{}, fmt.Errorf("dqn: plot: %w", err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return plot.Chart{}, fmt.Errorf("dqn: plot: %s: %w", path, err)
	}
	const header = "episode,frames,wall_seconds,return,mean_return"
	if len(rows) < 2 || strings.Join(rows[0], ",") != header {
		return plot.Chart{}, fmt.Errorf("dqn: plot: %s: want a header %q and at least one episode", path, header)
	}
	c := plot.Chart{
		Title:     "dqn on cartpole-v1: return by environment frames",
		XLabel:    "environment frames",
		YLabel:    "return",
		MeanLabel: "mean return of the last 100 episodes",
		Target:    475,
		YMax:      500,
	}
	var last []float64
	for i, r := range rows[1:] {
		v := make([]float64, len(r))
		for j, s := range r {
			if v[j], err = strconv.ParseFloat(s, 64); err != nil {
				return plot.Chart{}, fmt.Errorf("dqn: plot: %s: row %d: %w", path, i+2, err)
			}
		}
		if len(v) != 5 {
			return plot.Chart{}, fmt.Errorf("dqn: plot: %s: row %d has %d fields, want 5", path, i+2, len(v))
		}
		c.Points = append(c.Points, plot.Point{X: v[1], Y: v[3], Mean: v[4]})
		last = v
	}
	c.Subtitle = fmt.Sprintf("%d episodes, %.0f frames, %.0f s: final mean %.1f", int(last[0]), last[1], last[2], last[4])
	return c, nil
}
