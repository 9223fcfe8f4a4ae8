// Package plot draws a learning curve as a PNG with the standard library
// only: axes with ticks and labels, each episode's return as a dot, the
// running mean as a line, and the target as a dashed line.
package plot

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Point is one episode: X (environment frames, say), its return Y, and the
// running mean of the returns up to it.
type Point struct{ X, Y, Mean float64 }

// Chart is what to draw.
type Chart struct {
	// Title and Subtitle head the chart; XLabel and YLabel name the axes.
	Title, Subtitle, XLabel, YLabel string
	// MeanLabel names the running mean in the legend.
	MeanLabel string
	Points    []Point
	// Target draws a dashed horizontal line (0: none).
	Target float64
	// YMax is the top of the y axis (0: from the data).
	YMax float64
	// Compare holds other runs' running means, drawn as lines of their own
	// colours beside MeanLabel's, each named in the legend.
	Compare []Series
}

// Series is another run's running mean (Point.Mean by Point.X).
type Series struct {
	Label  string
	Points []Point
}

// compareColors are the lines of Chart.Compare, in order.
var compareColors = []color.RGBA{{230, 120, 20, 255}, {40, 150, 60, 255}, {150, 40, 150, 255},
	{20, 160, 170, 255}, {120, 120, 120, 255}}

// MaxCompare is the most Chart.Compare series a chart tells apart (one
// color each).
const MaxCompare = 5

// Size of the image and of its margins, in pixels; text is drawn with each
// font pixel scale×scale.
const (
	width, height            = 960, 560
	left, right, top, bottom = 100, 40, 80, 80
	scale                    = 2
)

var (
	white    = color.RGBA{255, 255, 255, 255}
	black    = color.RGBA{0, 0, 0, 255}
	grid     = color.RGBA{225, 225, 225, 255}
	dots     = color.RGBA{150, 185, 230, 255}
	meanLine = color.RGBA{20, 60, 160, 255}
	target   = color.RGBA{200, 30, 30, 255}
	gray     = color.RGBA{90, 90, 90, 255}
)

// WritePNG draws c and writes it to w as a PNG.
func WritePNG(w io.Writer, c Chart) error {
	img, err := Render(c)
	if err != nil {
		return err
	}
	return png.Encode(w, img)
}

// Render draws c.
func Render(c Chart) (*image.RGBA, error) {
	if len(c.Points) == 0 {
		return nil, fmt.Errorf("plot: no points")
	}
	xMax, yMax := 0.0, c.YMax
	all := c.Points
	for _, sr := range c.Compare {
		all = append(slices.Clip(all), sr.Points...)
	}
	for _, p := range all {
		xMax = max(xMax, p.X)
		if c.YMax == 0 {
			yMax = max(yMax, p.Y, p.Mean, c.Target)
		}
	}
	xStep := niceStep(xMax, 8)
	xMax = math.Ceil(xMax/xStep) * xStep
	yStep := niceStep(yMax, 6)
	yMax = math.Ceil(yMax/yStep) * yStep
	if xMax <= 0 || yMax <= 0 {
		return nil, fmt.Errorf("plot: empty ranges (x up to %v, y up to %v)", xMax, yMax)
	}

	img := image.NewRGBA(image.Rect(0, 0, width, height))
	fill(img, img.Bounds(), white)
	x0, x1, y0, y1 := left, width-right, height-bottom, top // plot area: x0..x1, y1 (top)..y0 (bottom)
	px := func(x float64) int { return x0 + int(math.Round(x/xMax*float64(x1-x0))) }
	py := func(y float64) int { return y0 - int(math.Round(y/yMax*float64(y0-y1))) }

	// Grid, ticks and their labels.
	for v := 0.0; v <= xMax+xStep/2; v += xStep {
		x := px(v)
		vline(img, x, y1, y0, grid)
		vline(img, x, y0, y0+6, black)
		label := tickLabel(v, xStep)
		text(img, x-textWidth(label)/2, y0+12, label, black)
	}
	for v := 0.0; v <= yMax+yStep/2; v += yStep {
		y := py(v)
		hline(img, x0, x1, y, grid)
		hline(img, x0-6, x0, y, black)
		label := tickLabel(v, yStep)
		text(img, x0-10-textWidth(label), y-glyphH*scale/2, label, black)
	}
	// Axes.
	vline(img, x0, y1, y0, black)
	hline(img, x0, x1, y0, black)

	// The data: episode returns, the target, the running mean.
	for _, p := range c.Points {
		fill(img, image.Rect(px(p.X)-1, py(p.Y)-1, px(p.X)+2, py(p.Y)+2), dots)
	}
	if c.Target > 0 {
		y := py(c.Target)
		for x := x0; x < x1; x += 12 {
			fill(img, image.Rect(x, y-1, min(x+7, x1), y+1), target)
		}
	}
	for k, sr := range c.Compare {
		col := compareColors[k%len(compareColors)]
		for i := 1; i < len(sr.Points); i++ {
			a, b := sr.Points[i-1], sr.Points[i]
			line(img, px(a.X), py(a.Mean), px(b.X), py(b.Mean), col)
		}
	}
	for i := 1; i < len(c.Points); i++ {
		a, b := c.Points[i-1], c.Points[i]
		line(img, px(a.X), py(a.Mean), px(b.X), py(b.Mean), meanLine)
	}

	// Titles, axis labels and the legend.
	text(img, (width-textWidth(c.Title))/2, 16, c.Title, black)
	text(img, (width-textWidth(c.Subtitle))/2, 16+(glyphH+4)*scale, c.Subtitle, gray)
	text(img, x0+(x1-x0-textWidth(c.XLabel))/2, height-bottom+40, c.XLabel, black)
	textUp(img, 16, y1+(y0-y1+textWidth(c.YLabel))/2, c.YLabel, black)
	// The legend sits in the bottom right corner, on a box of its own.
	entries := 2 + len(c.Compare)
	longest := max(textWidth(c.MeanLabel), textWidth("episode return"))
	for _, sr := range c.Compare {
		longest = max(longest, textWidth(sr.Label))
	}
	if c.Target > 0 {
		entries++
	}
	lineH := (glyphH + 5) * scale
	boxW, boxH := 40+longest+24, entries*lineH+16
	box := image.Rect(x1-boxW-12, y0-boxH-12, x1-12, y0-12)
	fill(img, box, gray)
	fill(img, box.Inset(1), white)
	lx, ly := box.Min.X+12, box.Min.Y+10
	legend := func(sample func(x, y int), label string) {
		sample(lx, ly+glyphH*scale/2)
		text(img, lx+40, ly, label, black)
		ly += lineH
	}
	legend(func(x, y int) { fill(img, image.Rect(x, y-2, x+30, y+2), meanLine) }, c.MeanLabel)
	for k, sr := range c.Compare {
		col := compareColors[k%len(compareColors)]
		legend(func(x, y int) { fill(img, image.Rect(x, y-2, x+30, y+2), col) }, sr.Label)
	}
	legend(func(x, y int) {
		for i := 0; i < 30; i += 8 {
			fill(img, image.Rect(x+i, y-1, x+i+3, y+2), dots)
		}
	}, "episode return")
	if c.Target > 0 {
		legend(func(x, y int) {
			fill(img, image.Rect(x, y-1, x+12, y+1), target)
			fill(img, image.Rect(x+18, y-1, x+30, y+1), target)
		}, "target "+strconv.FormatFloat(c.Target, 'f', -1, 64))
	}
	return img, nil
}

// niceStep returns a tick step of 1, 2 or 5 times a power of ten that cuts
// [0, v] into at most about n intervals.
func niceStep(v float64, n int) float64 {
	if v <= 0 {
		return 1
	}
	raw := v / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

// tickLabel formats a tick value: thousands as "20k" when the step allows.
func tickLabel(v, step float64) string {
	if step >= 1000 && math.Mod(step, 1000) == 0 {
		return strconv.FormatFloat(v/1000, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

func hline(img *image.RGBA, xa, xb, y int, c color.RGBA) {
	fill(img, image.Rect(xa, y, xb+1, y+1), c)
}

func vline(img *image.RGBA, x, ya, yb int, c color.RGBA) {
	fill(img, image.Rect(x, ya, x+1, yb+1), c)
}

// line draws a line 3 pixels thick from (xa, ya) to (xb, yb).
func line(img *image.RGBA, xa, ya, xb, yb int, c color.RGBA) {
	dx, dy := abs(xb-xa), -abs(yb-ya)
	sx, sy := sign(xb-xa), sign(yb-ya)
	e := dx + dy
	for {
		fill(img, image.Rect(xa-1, ya-1, xa+2, ya+2), c)
		if xa == xb && ya == yb {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			xa += sx
		}
		if e2 <= dx {
			e += dx
			ya += sy
		}
	}
}

func abs(v int) int { return max(v, -v) }

func sign(v int) int {
	switch {
	case v > 0:
		return 1
	case v < 0:
		return -1
	}
	return 0
}

// textWidth is the width of s in pixels.
func textWidth(s string) int { return len([]rune(s)) * glyphW * scale }

// text draws s with its top left corner at (x, y); upper-case letters are
// drawn as lower-case ones, and characters the font lacks as spaces.
func text(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for _, r := range strings.ToLower(s) {
		g := glyphs[r]
		for row, bits := range g {
			for col, b := range bits {
				if b == '#' {
					fill(img, image.Rect(x+col*scale, y+row*scale, x+(col+1)*scale, y+(row+1)*scale), c)
				}
			}
		}
		x += glyphW * scale
	}
}

// textUp draws s rotated a quarter turn counterclockwise, reading upwards
// from (x, y) at its bottom left.
func textUp(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for _, r := range strings.ToLower(s) {
		g := glyphs[r]
		for row, bits := range g {
			for col, b := range bits {
				if b == '#' {
					fill(img, image.Rect(x+row*scale, y-(col+1)*scale, x+(row+1)*scale, y-col*scale), c)
				}
			}
		}
		y -= glyphW * scale
	}
}
