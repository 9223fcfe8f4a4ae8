package plot

import (
	"bytes"
	"image/png"
	"testing"
)

// A chart draws its target line, its mean line and its dots where the axes
// put them.
func TestRender(t *testing.T) {
	c := Chart{Title: "Title", Subtitle: "sub", XLabel: "frames", YLabel: "return", MeanLabel: "mean", Target: 475, YMax: 500}
	for i := range 101 {
		x := float64(i * 1000)
		c.Points = append(c.Points, Point{X: x, Y: float64(5 * (i % 7)), Mean: float64(i * 5)})
	}
	img, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != width || b.Dy() != height {
		t.Fatalf("bounds %v", b)
	}
	// x spans [0, 100k] over [left, width-right]; y spans [0, 500] over
	// [height-bottom, top].
	px := func(x float64) int { return left + int(x/100_000*float64(width-right-left)+0.5) }
	py := func(y float64) int { return height - bottom - int(y/500*float64(height-bottom-top)+0.5) }
	if got := img.RGBAAt(px(50_000), py(475)); got != target && got != meanLine {
		t.Errorf("target line at y=475: %v", got)
	}
	if got := img.RGBAAt(px(60_000), py(300)); got != meanLine {
		t.Errorf("mean line at (60k, 300): %v", got)
	}
	if got := img.RGBAAt(left, py(250)); got != black {
		t.Errorf("y axis: %v", got)
	}
	var buf bytes.Buffer
	if err := WritePNG(&buf, c); err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := Render(Chart{}); err == nil {
		t.Fatal("empty chart drawn")
	}
}

func TestNiceSteps(t *testing.T) {
	for _, c := range []struct{ v, want float64 }{{500, 100}, {121_000, 50_000}, {7, 2}, {300_000, 50_000}, {0.3, 0.05}} {
		if got := niceStep(c.v, 6); got != c.want {
			t.Errorf("niceStep(%v, 6) = %v, want %v", c.v, got, c.want)
		}
	}
	if got := tickLabel(40_000, 20_000); got != "40k" {
		t.Errorf("tickLabel = %q", got)
	}
	if got := tickLabel(250, 50); got != "250" {
		t.Errorf("tickLabel = %q", got)
	}
}
