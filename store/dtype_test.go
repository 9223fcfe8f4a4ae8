package store_test

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// Every name DTypeNames lists parses to a valid type that prints as that name,
// and every valid type is listed: the names have one source.
func TestDTypeNamesRoundTrip(t *testing.T) {
	names := store.DTypeNames()
	if len(names) == 0 {
		t.Fatal("no element type names")
	}
	for i, name := range names {
		d, err := store.ParseDType(name)
		if err != nil {
			t.Fatalf("ParseDType(%q): %v", name, err)
		}
		if int(d) != i+1 || !d.Valid() || d.String() != name || d.Size() < 1 {
			t.Errorf("%q: type %d (want %d), valid %v, String %q, size %d", name, d, i+1, d.Valid(), d.String(), d.Size())
		}
		var back store.DType
		if b, err := d.MarshalText(); err != nil || back.UnmarshalText(b) != nil || back != d {
			t.Errorf("%q: text round trip gave %v (%v)", name, back, err)
		}
	}
	if next := store.DType(len(names) + 1); next.Valid() {
		t.Errorf("type %d is valid but DTypeNames lists %d types", next, len(names))
	}
	if store.DType(0).Valid() {
		t.Error("type 0 is valid")
	}
	for _, bad := range []string{"", "bytes", "complex64", "Float32", "int"} {
		_, err := store.ParseDType(bad)
		if err == nil || !strings.Contains(err.Error(), "want one of "+strings.Join(names, ", ")) {
			t.Errorf("ParseDType(%q): %v, want an error listing %v", bad, err, names)
		}
	}
}

// The values of the types are stored in segments and checkpoints: they never
// change.
func TestDTypeValuesAreStable(t *testing.T) {
	for d, name := range map[store.DType]string{
		1: "float32", 2: "float64", 3: "float16", 4: "bfloat16", 5: "int32", 6: "int64", 7: "uint8", 8: "bool",
		9: "int8", 10: "int16", 11: "uint16", 12: "uint32", 13: "uint64",
	} {
		if d.String() != name {
			t.Errorf("type %d is %q, want %q", uint8(d), d, name)
		}
	}
}

// typedColumn checks that T stands for d, with d's size, and that a block of a
// d column written as []T reads back, in the shard, in a view and after a
// checkpoint and restore.
func typedColumn[T store.Element](t *testing.T, d store.DType, vals []T) {
	t.Helper()
	var z T
	if got := store.DTypeOf[T](); got != d || int(unsafe.Sizeof(z)) != d.Size() {
		t.Fatalf("%s: DTypeOf = %s, Go size %d, Size() %d", d, got, unsafe.Sizeof(z), d.Size())
	}
	spec := store.Spec{Capacity: 2, Remover: store.RemoverFIFO, Columns: []store.Column{
		{Name: "x", DType: d, Shape: []int{len(vals)}, Length: 1},
	}}
	s := storetest.Create(t, spec)
	p, err := s.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var wrong error
	if d == store.Float32 {
		wrong = store.PutFrame(p, 0, 0, make([]float64, len(vals)))
	} else {
		wrong = store.PutFrame(p, 0, 0, make([]float32, len(vals)))
	}
	if wrong == nil || !strings.Contains(wrong.Error(), "want "+store.FormatShape(spec.Columns[0].Shape)+" "+d.String()) {
		t.Errorf("%s column written as another type: %v", d, wrong)
	}
	if err := store.PutFrame(p, 0, 0, vals, len(vals)); err != nil {
		t.Fatalf("%s: %v", d, err)
	}
	ref, err := p.Commit(1)
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.Read(ref)
	if err != nil {
		t.Fatal(err)
	}
	got, err := store.Block[T](v, 0)
	if err != nil || !slices.Equal(got, vals) {
		t.Fatalf("%s: read %v (%v), want %v", d, got, err, vals)
	}
	v.Done()
	path := filepath.Join(t.TempDir(), d.String()+".ckpt")
	if err := s.Checkpoint(context.Background(), path); err != nil {
		t.Fatal(err)
	}
	r := restore(t, path, store.WithSpec(spec))
	rv, err := r.Read(ref)
	if err != nil {
		t.Fatal(err)
	}
	defer rv.Done()
	if got, err := store.Block[T](rv, 0); err != nil || !slices.Equal(got, vals) {
		t.Fatalf("%s after restore: %v (%v), want %v", d, got, err, vals)
	}
}

// Every element type is a column a shard holds, reads and checkpoints.
func TestEveryDType(t *testing.T) {
	tested := map[store.DType]func(t *testing.T, d store.DType){
		store.Float32:  func(t *testing.T, d store.DType) { typedColumn(t, d, []float32{1.5, -2, 3e30}) },
		store.Float64:  func(t *testing.T, d store.DType) { typedColumn(t, d, []float64{1.5, -2, 3e300}) },
		store.Float16:  func(t *testing.T, d store.DType) { typedColumn(t, d, []store.Float16Bits{0x3c00, 0xc000, 1}) },
		store.BFloat16: func(t *testing.T, d store.DType) { typedColumn(t, d, []store.BFloat16Bits{0x3f80, 0xc000, 1}) },
		store.Int32:    func(t *testing.T, d store.DType) { typedColumn(t, d, []int32{-1 << 31, 0, 1<<31 - 1}) },
		store.Int64:    func(t *testing.T, d store.DType) { typedColumn(t, d, []int64{-1 << 63, 0, 1<<63 - 1}) },
		store.Uint8:    func(t *testing.T, d store.DType) { typedColumn(t, d, []uint8{0, 7, 255}) },
		store.Bool:     func(t *testing.T, d store.DType) { typedColumn(t, d, []bool{true, false, true}) },
		store.Int8:     func(t *testing.T, d store.DType) { typedColumn(t, d, []int8{-128, 0, 127}) },
		store.Int16:    func(t *testing.T, d store.DType) { typedColumn(t, d, []int16{-1 << 15, 0, 1<<15 - 1}) },
		store.Uint16:   func(t *testing.T, d store.DType) { typedColumn(t, d, []uint16{0, 1, 1<<16 - 1}) },
		store.Uint32:   func(t *testing.T, d store.DType) { typedColumn(t, d, []uint32{0, 1, 1<<32 - 1}) },
		store.Uint64:   func(t *testing.T, d store.DType) { typedColumn(t, d, []uint64{0, 1, 1<<64 - 1}) },
	}
	for _, name := range store.DTypeNames() {
		d, _ := store.ParseDType(name)
		run, ok := tested[d]
		if !ok {
			t.Errorf("element type %s has no test here", name)
			continue
		}
		t.Run(name, func(t *testing.T) { run(t, d) })
	}
}

// Column.Validate is the per-column part of Spec.Validate.
func TestColumnValidate(t *testing.T) {
	ok := store.Column{Name: "obs", DType: store.Int8, Shape: []int{84, 84}, Length: 2}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c    store.Column
		want string
	}{
		{store.Column{DType: store.Int8, Length: 1}, "no name"},
		{store.Column{Name: strings.Repeat("a", store.MaxNameLen+1), DType: store.Int8, Length: 1}, "name longer than"},
		{store.Column{Name: "a", DType: 0, Length: 1}, `column "a": invalid element type 0`},
		{store.Column{Name: "a", DType: store.Uint16, Length: 0}, "length 0"},
		{store.Column{Name: "a", DType: store.Uint16, Shape: []int{1, 0}, Length: 1}, "dimensions must be positive"},
		{store.Column{Name: "a", DType: store.Uint16, Shape: make([]int, store.MaxDims+1), Length: 1}, "dimensions, at most"},
		{store.Column{Name: "a", DType: store.Uint64, Shape: []int{1 << 20, 1 << 20}, Length: 1}, "overflows"},
	} {
		err := tc.c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.c, err, tc.want)
		}
		spec := store.Spec{Capacity: 1, Columns: []store.Column{tc.c}}
		if tc.c.Name != "" && (spec.Validate() == nil || spec.Validate().Error() != err.Error()) {
			t.Errorf("%+v: Spec.Validate %v, Column.Validate %v", tc.c, spec.Validate(), err)
		}
	}
}
