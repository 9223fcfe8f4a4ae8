// Package sampletest holds test helpers for package sample: a chi-square
// goodness-of-fit test for checking selection distributions.
package sampletest

import (
	"fmt"
	"math"
)

// ChiSquare compares observed counts with expected probabilities (which need not be
// normalised; bins with zero expectation must have zero counts). It returns the
// statistic, the degrees of freedom and the p-value: the probability that a
// correct sampler gives a statistic at least this large.
func ChiSquare(observed []int, expected []float64) (stat float64, dof int, p float64, err error) {
	if len(observed) != len(expected) {
		return 0, 0, 0, fmt.Errorf("sampletest: %d observed bins, %d expected", len(observed), len(expected))
	}
	var n, sum float64
	for i, o := range observed {
		n += float64(o)
		if expected[i] < 0 || math.IsNaN(expected[i]) {
			return 0, 0, 0, fmt.Errorf("sampletest: expected[%d] = %v", i, expected[i])
		}
		sum += expected[i]
	}
	bins := 0
	for i, o := range observed {
		e := expected[i] / sum * n
		if e == 0 {
			if o != 0 {
				return math.Inf(1), 0, 0, nil
			}
			continue
		}
		d := float64(o) - e
		stat += d * d / e
		bins++
	}
	dof = bins - 1
	if dof < 1 {
		return stat, dof, 1, nil
	}
	return stat, dof, UpperGamma(float64(dof)/2, stat/2), nil
}

// UpperGamma is the regularised upper incomplete gamma function Q(a, x).
func UpperGamma(a, x float64) float64 {
	if x <= 0 {
		return 1
	}
	lg, _ := math.Lgamma(a)
	if x < a+1 {
		// Series for P(a, x).
		ap, del, s := a, 1/a, 1/a
		for range 1000 {
			ap++
			del *= x / ap
			s += del
			if math.Abs(del) < math.Abs(s)*1e-15 {
				break
			}
		}
		return 1 - s*math.Exp(-x+a*math.Log(x)-lg)
	}
	// Continued fraction for Q(a, x) (modified Lentz).
	const tiny = 1e-300
	b := x + 1 - a
	c := 1 / tiny
	d := 1 / b
	h := d
	for i := 1; i < 1000; i++ {
		an := -float64(i) * (float64(i) - a)
		b += 2
		d = an*d + b
		if math.Abs(d) < tiny {
			d = tiny
		}
		c = b + an/c
		if math.Abs(c) < tiny {
			c = tiny
		}
		d = 1 / d
		del := d * c
		h *= del
		if math.Abs(del-1) < 1e-15 {
			break
		}
	}
	return math.Exp(-x+a*math.Log(x)-lg) * h
}
