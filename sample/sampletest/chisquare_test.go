package sampletest

import (
	"math"
	"testing"
)

func TestUpperGammaKnownValues(t *testing.T) {
	// Chi-square survival function values (dof, x, p) from standard tables.
	for _, c := range []struct{ dof, x, p float64 }{
		{1, 3.841458820694124, 0.05},
		{1, 10.827566170662733, 0.001},
		{10, 18.307038053275146, 0.05},
		{10, 29.58829844507442, 0.001},
		{100, 124.34211340400407, 0.05},
		{3, 0, 1},
	} {
		got := UpperGamma(c.dof/2, c.x/2)
		if math.Abs(got-c.p) > 1e-9 {
			t.Errorf("Q(%v/2, %v/2) = %v, want %v", c.dof, c.x, got, c.p)
		}
	}
}

func TestChiSquare(t *testing.T) {
	stat, dof, p, err := ChiSquare([]int{50, 50, 0}, []float64{1, 1, 0})
	if err != nil || stat != 0 || dof != 1 || p != 1 {
		t.Fatalf("even counts: stat %v dof %d p %v err %v", stat, dof, p, err)
	}
	_, _, p, _ = ChiSquare([]int{90, 10}, []float64{1, 1})
	if p > 1e-6 {
		t.Fatalf("90/10 against 50/50: p = %v, want tiny", p)
	}
	if _, _, p, _ := ChiSquare([]int{1, 1}, []float64{1, 0}); p != 0 {
		t.Fatalf("count in a zero bin: p = %v, want 0", p)
	}
	if _, _, _, err := ChiSquare([]int{1}, []float64{1, 2}); err == nil {
		t.Fatal("length mismatch accepted")
	}
}
