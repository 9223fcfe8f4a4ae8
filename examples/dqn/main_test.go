package main

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/internal/statehome"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	removeState := statehome.Private()
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { removeState(); bins.Remove() }))
}

// The CI run: --quick must lift the mean return over 20 episodes from a random
// policy's (about 20) to 150, and write a well-formed learning curve.
func TestQuickRunSolvesAndWritesCurve(t *testing.T) {
	curve := filepath.Join(t.TempDir(), "curve.csv")
	var out, errb bytes.Buffer
	code := run([]string{"--quick", "--seed", "1", "--curve", curve, "--report-every", "1h"}, &out, &errb)
	t.Log(strings.TrimSpace(out.String()))
	if code != 0 {
		t.Fatalf("exit %d, want 0; stderr: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "dqn: solved:") {
		t.Fatalf("no solved line in %q", out.String())
	}
	f, err := os.Open(curve)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(rows[0], ",") != "episode,frames,wall_seconds,return,mean_return" || len(rows) < 21 {
		t.Fatalf("curve header %v, %d rows", rows[0], len(rows))
	}
	prevFrames := 0
	for i, r := range rows[1:] {
		ep, _ := strconv.Atoi(r[0])
		frames, _ := strconv.Atoi(r[1])
		ret, _ := strconv.ParseFloat(r[3], 64)
		if ep != i+1 || frames <= prevFrames || ret < 1 || ret > 500 {
			t.Fatalf("row %d = %v", i+1, r)
		}
		prevFrames = frames
	}
	last, _ := strconv.ParseFloat(rows[len(rows)-1][4], 64)
	if last < 150 {
		t.Fatalf("final mean return %v, want >= 150", last)
	}

	// --plot draws it.
	out.Reset()
	pngPath := filepath.Join(t.TempDir(), "curve.png")
	if code := run([]string{"--plot", curve, "--out", pngPath}, &out, &errb); code != 0 {
		t.Fatalf("--plot: exit %d: %s", code, errb.String())
	}
	f2, err := os.Open(pngPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	img, err := png.Decode(f2)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 960 || b.Dy() != 560 {
		t.Fatalf("plot of %v", b)
	}
	if !strings.Contains(out.String(), "final mean") {
		t.Fatalf("--plot said %q", out.String())
	}
}

func TestPlotErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.csv")
	os.WriteFile(bad, []byte("episode,frames\n1,2\n"), 0o644)
	var out, errb bytes.Buffer
	for _, path := range []string{bad, filepath.Join(dir, "missing.csv")} {
		if code := run([]string{"--plot", path}, &out, &errb); code != 1 {
			t.Errorf("--plot %s: exit %d, want 1", path, code)
		}
	}
	if !strings.Contains(errb.String(), "want a header") || !strings.Contains(errb.String(), "missing.csv") {
		t.Errorf("stderr %q", errb.String())
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--lr", "-1"},
		{"--hidden", "64,x"},
		{"--nope"},
		{"extra"},
		{"--role", "trainer"}, // a world of one runs every role itself
		{"--samples", "pigeon"},
		{"--backlog", "0"},
	} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
		if !strings.Contains(errb.String(), "dqn") && !strings.Contains(errb.String(), "flag") {
			t.Errorf("%v: stderr %q does not name the problem", args, errb.String())
		}
	}
}

func TestNotSolvedExitsOne(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"--quick", "--frames", "300", "--report-every", "1h"}, &out, &errb); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if !strings.Contains(out.String(), "not solved: ") || !strings.Contains(out.String(), "300 frames") {
		t.Fatalf("output %q", out.String())
	}
}

// TestPlotCompare: --compare draws a second run's running mean beside the
// first's and names both final means.
func TestPlotCompare(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, base float64) string {
		var b strings.Builder
		b.WriteString("episode,frames,wall_seconds,return,mean_return\n")
		for i := 1; i <= 10; i++ {
			fmt.Fprintf(&b, "%d,%d,%d,%g,%g\n", i, 100*i, i, base+float64(i), base+float64(i)/2)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	killed, clean := write("killed.csv", 100), write("clean.csv", 200)
	pngPath := filepath.Join(dir, "both.png")
	var out, errb bytes.Buffer
	if code := run([]string{"--plot", killed, "--compare", clean, "--label", "with a kill", "--compare-label", "without", "--out", pngPath}, &out, &errb); code != 0 {
		t.Fatalf("--plot --compare: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "final mean 105.0; without: final mean 205.0") {
		t.Errorf("--plot --compare said %q", out.String())
	}
	f, err := os.Open(pngPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatal(err)
	}
	if code := run([]string{"--plot", killed, "--compare", filepath.Join(dir, "missing.csv")}, &out, &errb); code != 1 {
		t.Errorf("--compare of a missing file: exit %d, want 1", code)
	}
	// Up to five other runs, each in a color of its own; a sixth is refused.
	args := []string{"--plot", killed, "--out", pngPath}
	for i := range 6 {
		args = append(args, "--compare", write(fmt.Sprintf("clean%d.csv", i), float64(200+10*i)))
	}
	out.Reset()
	if code := run(args[:len(args)-2], &out, &errb); code != 0 || !strings.Contains(out.String(), "clean4.csv: final mean 245.0") {
		t.Errorf("--plot with 5 --compare: exit %d, %q, %s", code, out.String(), errb.String())
	}
	errb.Reset()
	if code := run(args, &out, &errb); code != 2 || !strings.Contains(errb.String(), "6 --compare curves, at most 5") {
		t.Errorf("--plot with 6 --compare: exit %d, %q", code, errb.String())
	}
}

// TestCurveAcrossRestarts: each episode is in the curve's file as soon as it
// is added (a trainer killed with SIGKILL closes nothing), and a restarted
// generation appends to the file without a second header.
func TestCurveAcrossRestarts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "curve.csv")
	c, err := openCurve(path, false)
	if err != nil {
		t.Fatal(err)
	}
	c.add(agent.Progress{Episodes: 1, Frames: 20, Return: 20, MeanReturn: 20})
	c.add(agent.Progress{Episodes: 2, Frames: 50, Return: 30, MeanReturn: 25})
	// No close: the first generation was killed.
	c2, err := openCurve(path, true)
	if err != nil {
		t.Fatal(err)
	}
	c2.add(agent.Progress{Episodes: 3, Frames: 90, Return: 40, MeanReturn: 30})
	if err := c2.close(); err != nil {
		t.Fatal(err)
	}
	c.f.Close()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "episode,frames,wall_seconds,return,mean_return\n1,20,0.000,20,20.00\n2,50,0.000,30,25.00\n3,90,0.000,40,30.00\n"
	if string(b) != want {
		t.Errorf("curve:\n%s\nwant:\n%s", b, want)
	}
	// A fresh run starts the file afresh.
	c3, err := openCurve(path, false)
	if err != nil {
		t.Fatal(err)
	}
	c3.close()
	if b, _ := os.ReadFile(path); string(b) != "episode,frames,wall_seconds,return,mean_return\n" {
		t.Errorf("fresh curve: %q", b)
	}
}
