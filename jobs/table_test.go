package jobs

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gear-rl/gear/sample"
	"github.com/gear-rl/gear/sample/reverb"
	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// tableDoc is a valid [table] over two ranks with the given lines added to
// [table], a second column of dtype, and [table.rate_limiter] lines.
func tableDoc(table, dtype, limiter string) string {
	return validBase + "[table]\ncapacity = 10\ntrajectory_length = 4\n" + table +
		"[[table.columns]]\nname = \"obs\"\ndtype = \"float32\"\nshape = [4]\n" +
		"[[table.columns]]\nname = \"x\"\ndtype = " + fmt.Sprintf("%q", dtype) + "\n" +
		"[table.rate_limiter]\n" + limiter
}

// vocabResult is what validate and a program make of one document.
type vocabResult struct {
	validErr, buildErr error
	built              store.Spec
	cfg                sample.Config
}

// vocabCase parses doc as Validate would and builds its table as a program
// would. A table that fails Validate is built from the spec before
// validation.
func vocabCase(t *testing.T, doc string) vocabResult {
	t.Helper()
	var r vocabResult
	spec, err := Parse([]byte(doc), "")
	if err != nil {
		r.validErr = err
		if spec, err = parseNoValidate(doc); err != nil {
			t.Fatalf("the document does not decode: %v\n%s", err, doc)
		}
	}
	var rt reverb.Table
	r.built, rt, r.buildErr = spec.Table.Build(spec.WorldSize())
	if r.buildErr == nil {
		// A table Build describes is one sample builds.
		if r.cfg, err = sample.NewConfig(rt); err != nil {
			t.Fatalf("sample.NewConfig of a built table: %v\n%s", err, doc)
		}
	}
	return r
}

// parseNoValidate decodes doc and fills its defaults as Parse does, without
// validating.
func parseNoValidate(doc string) (*Spec, error) { return DecodeDefaults([]byte(doc), "") }

// TestDecodeDefaultsKeepsWrittenZeros: an explicit priority_exponent = 0.0
// (Reverb's alpha 0: every item alike) stays 0 through DecodeDefaults, the
// way libgear reads a [table], where a missing one becomes 1.
func TestDecodeDefaultsKeepsWrittenZeros(t *testing.T) {
	const doc = "[table]\ncapacity = 8\ntrajectory_length = 1\nsampler = \"prioritized\"\n"
	for _, c := range []struct {
		line string
		want float64
	}{{"priority_exponent = 0.0\n", 0}, {"", 1}, {"priority_exponent = 0.5\n", 0.5}} {
		s, err := DecodeDefaults([]byte(doc+c.line), "")
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Table.PriorityExponent; got != c.want {
			t.Errorf("%q: priority_exponent %v, want %v", c.line, got, c.want)
		}
		if s.Table.RateLimiter.Kind != LimiterMinSize || s.Table.Name != DefaultTableName {
			t.Errorf("%q: defaults not filled: %+v", c.line, s.Table)
		}
	}
}

// hasField reports whether err holds a *FieldError of field.
func hasField(err error, field string) bool {
	for _, line := range strings.Split(err.Error(), "\n") {
		if strings.HasPrefix(line, "jobs: "+field+": ") {
			return true
		}
	}
	return false
}

// Every dtype store parses validates in a [table] and builds a column of that
// type; every dtype validate accepts builds and is store's; the others are
// refused by both, naming the column's dtype field.
func TestTableVocabularyDTypes(t *testing.T) {
	candidates := slices.Concat(store.DTypeNames(),
		// What jobs once listed on its own, and names store never had.
		[]string{"float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool", "bytes"},
		[]string{"", "complex64", "Float32", "int", "float", "string", "uint8 "})
	accepted := 0
	for _, name := range candidates {
		r := vocabCase(t, tableDoc("", name, ""))
		validErr, buildErr, built := r.validErr, r.buildErr, r.built
		d, storeErr := store.ParseDType(name)
		if (validErr == nil) != (storeErr == nil) || (buildErr == nil) != (storeErr == nil) {
			t.Errorf("dtype %q: validate %v, build %v, store.ParseDType %v: they disagree", name, validErr, buildErr, storeErr)
			continue
		}
		if storeErr != nil {
			for _, err := range []error{validErr, buildErr} {
				if !hasField(err, "table.columns[1].dtype") || !strings.Contains(err.Error(), storeErr.Error()) {
					t.Errorf("dtype %q: %v, want table.columns[1].dtype: %v", name, err, storeErr)
				}
			}
			continue
		}
		accepted++
		if c := built.Columns[1]; c.DType != d || c.Name != "x" || c.Length != 4 {
			t.Errorf("dtype %q built column %+v", name, c)
		}
	}
	if accepted < len(store.DTypeNames()) {
		t.Errorf("%d dtypes accepted, store has %d", accepted, len(store.DTypeNames()))
	}
}

// The same for selectors, as the sampler and as the remover.
func TestTableVocabularySelectors(t *testing.T) {
	candidates := slices.Concat(sample.SelectorNames(),
		[]string{"uniform", "prioritized", "fifo", "lifo", "max_heap", "min_heap", "maxheap", "minheap"},
		[]string{"random", "MaxHeap", "max-heap", "heap", "Uniform", "lowest_priority", "none"})
	for _, role := range []string{"sampler", "remover"} {
		accepted := 0
		for _, name := range candidates {
			r := vocabCase(t, tableDoc(role+" = "+fmt.Sprintf("%q", name)+"\n", "int32", ""))
			validErr, buildErr, cfg := r.validErr, r.buildErr, r.cfg
			k, sampleErr := sample.ParseKind(name)
			if (validErr == nil) != (sampleErr == nil) || (buildErr == nil) != (sampleErr == nil) {
				t.Errorf("%s %q: validate %v, build %v, sample.ParseKind %v: they disagree", role, name, validErr, buildErr, sampleErr)
				continue
			}
			if sampleErr != nil {
				for _, err := range []error{validErr, buildErr} {
					if !hasField(err, "table."+role) || !strings.Contains(err.Error(), "want one of uniform") {
						t.Errorf("%s %q: %v, want table.%s: want one of ...", role, name, err, role)
					}
				}
				continue
			}
			accepted++
			sel := cfg.Sampler
			if role == "remover" {
				sel = cfg.Remover
			}
			if sel.Kind() != k {
				t.Errorf("%s %q built a %s selector", role, name, sel.Kind())
			}
			if p, ok := sel.(*sample.Prioritized); ok && p.Exponent() != 1 {
				t.Errorf("%s %q: exponent %g, want the default 1", role, name, p.Exponent())
			}
		}
		if accepted < len(sample.SelectorNames()) {
			t.Errorf("%s: %d names accepted, sample has %d", role, accepted, len(sample.SelectorNames()))
		}
	}
}

// The same for rate limiters: each kind with the parameters it takes.
func TestTableVocabularyLimiters(t *testing.T) {
	params := func(kind string) (string, sample.LimiterParams) {
		if kind == LimiterSampleToInsertRatio {
			return "samples_per_insert = 2.0\nerror_buffer = 10.0\n", sample.LimiterParams{MinSizeToSample: 1, SamplesPerInsert: 2, ErrorBuffer: 10, MaxSize: 20}
		}
		return "", sample.LimiterParams{MinSizeToSample: 1, MaxSize: 20}
	}
	candidates := slices.Concat(sample.LimiterNames(),
		[]string{"min_size", "sample_to_insert_ratio", "queue", "stack"},
		[]string{"leaky", "MinSize", "min-size", "ratio", "fifo"})
	accepted := 0
	for _, kind := range candidates {
		extra, p := params(kind)
		r := vocabCase(t, tableDoc("", "int32", "kind = "+fmt.Sprintf("%q", kind)+"\n"+extra))
		validErr, buildErr, cfg := r.validErr, r.buildErr, r.cfg
		want, sampleErr := sample.NewRateLimit(kind, p)
		if (validErr == nil) != (sampleErr == nil) || (buildErr == nil) != (sampleErr == nil) {
			t.Errorf("rate limiter %q: validate %v, build %v, sample.NewRateLimit %v: they disagree", kind, validErr, buildErr, sampleErr)
			continue
		}
		if sampleErr != nil {
			for _, err := range []error{validErr, buildErr} {
				if !hasField(err, "table.rate_limiter.kind") {
					t.Errorf("rate limiter %q: %v, want table.rate_limiter.kind", kind, err)
				}
			}
			continue
		}
		accepted++
		if cfg.RateLimit != want {
			t.Errorf("rate limiter %q built %+v, want %+v", kind, cfg.RateLimit, want)
		}
	}
	if accepted < len(sample.LimiterNames()) {
		t.Errorf("%d limiters accepted, sample has %d", accepted, len(sample.LimiterNames()))
	}
}

// Tables that validated before the constructors were shared, and then failed
// when a program built them, are refused by validate, naming the field.
func TestTableRefusedAsBuilt(t *testing.T) {
	for _, tc := range []struct {
		name, doc, field, problem string
	}{
		{"bytes", tableDoc("", "bytes", ""), "table.columns[1].dtype", `unknown element type "bytes"`},
		{"error_buffer too narrow", tableDoc("", "int32", "kind = \"sample_to_insert_ratio\"\nsamples_per_insert = 4.0\n"),
			"table.rate_limiter.error_buffer", "could block both inserts and samples"},
		{"exponent NaN", tableDoc("sampler = \"prioritized\"\npriority_exponent = nan\n", "int32", ""), "table.priority_exponent", "must be finite"},
		{"samples_per_insert inf", tableDoc("", "int32", "kind = \"sample_to_insert_ratio\"\nsamples_per_insert = inf\nerror_buffer = 10.0\n"),
			"table.rate_limiter.samples_per_insert", "must be finite"},
		{"too many dimensions", tableDoc("", "int32", "") + "[[table.columns]]\nname = \"y\"\ndtype = \"int8\"\nshape = [1, 1, 1, 1, 1, 1, 1, 1, 1]\n",
			"table.columns[2]", "dimensions, at most 8"},
		{"capacity", strings.Replace(tableDoc("", "int32", ""), "capacity = 10", fmt.Sprintf("capacity = %d", store.MaxCapacity), 1), "table.capacity", "at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := vocabCase(t, tc.doc)
			for what, err := range map[string]error{"validate": r.validErr, "build": r.buildErr} {
				if err == nil || !hasField(err, tc.field) || !strings.Contains(err.Error(), tc.problem) {
					t.Errorf("%s: %v, want %s: ...%s", what, err, tc.field, tc.problem)
				}
			}
		})
	}
	// Both spellings of the heaps, a prioritized remover with the sampler's
	// exponent, and a queue's preset build.
	for _, doc := range []string{
		tableDoc("sampler = \"max_heap\"\nremover = \"minheap\"\n", "uint16", ""),
		tableDoc("sampler = \"uniform\"\nremover = \"prioritized\"\npriority_exponent = 0.5\n", "bool", ""),
		tableDoc("", "int8", "kind = \"queue\"\n"),
	} {
		if r := vocabCase(t, doc); r.validErr != nil || r.buildErr != nil {
			t.Errorf("validate %v, build %v:\n%s", r.validErr, r.buildErr, doc)
		}
	}
}

// Build gives a store spec and a sample config that the packages accept, with
// what the spec says.
func TestTableBuild(t *testing.T) {
	s, err := Parse([]byte(tableDoc("sampler = \"prioritized\"\npriority_exponent = 0.6\nremover = \"max_heap\"\nmax_times_sampled = 3\n", "uint8",
		"kind = \"sample_to_insert_ratio\"\nmin_size_to_sample = 15\nsamples_per_insert = 2.0\nerror_buffer = 8.0\n")), "")
	if err != nil {
		t.Fatal(err)
	}
	spec, rt, err := s.Table.Build(2)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := sample.NewConfig(rt)
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
	wantCols := []store.Column{
		{Name: "obs", DType: store.Float32, Shape: []int{4}, Length: 4},
		{Name: "x", DType: store.Uint8, Length: 4},
	}
	if spec.Capacity != 11 || spec.Remover != store.RemoverNone || len(spec.Columns) != 2 ||
		!equalColumn(spec.Columns[0], wantCols[0]) || !equalColumn(spec.Columns[1], wantCols[1]) {
		t.Errorf("store spec %+v", spec)
	}
	rl, err := sample.SampleToInsertRatio(2, 15, 8)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Name != "replay" || cfg.MaxSize != 10 || cfg.MaxTimesSampled != 3 || cfg.RateLimit != rl ||
		cfg.Sampler.Kind() != sample.KindPrioritized || cfg.Sampler.(*sample.Prioritized).Exponent() != 0.6 ||
		cfg.Remover.Kind() != sample.KindMaxHeap {
		t.Errorf("sample config %+v", cfg)
	}
	tb, err := sample.NewTable(cfg)
	if err != nil {
		t.Fatalf("sample.NewTable of the built config: %v", err)
	}
	tb.Close()
	// Each NewConfig gives fresh selectors.
	again, err := sample.NewConfig(rt)
	if err != nil || again.Sampler == cfg.Sampler || again.Remover == cfg.Remover {
		t.Errorf("a second NewConfig shares selectors with the first (%v)", err)
	}
	if _, _, err := s.Table.Build(0); err == nil {
		t.Error("Build over 0 shards succeeded")
	}
	// min_size_to_sample is the whole table's: 15 fits 2 shards of 10, not 1.
	if _, _, err := s.Table.Build(1); err == nil || !hasField(err, "table.rate_limiter.min_size_to_sample") {
		t.Errorf("Build over 1 shard: %v", err)
	}
	// A queue's length is the whole table's.
	q, err := Parse([]byte(tableDoc("", "int32", "kind = \"queue\"\n")), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, qt, err := q.Table.Build(3); err != nil || sample.RateLimit(qt.Limit) != sample.Queue(30) {
		t.Errorf("queue over 3 shards: %+v, %v; want %+v", qt.Limit, err, sample.Queue(30))
	}
}

func equalColumn(a, b store.Column) bool {
	return a.Name == b.Name && a.DType == b.DType && a.Length == b.Length && slices.Equal(a.Shape, b.Shape)
}

// Every example job spec with a [table] builds it.
func TestExampleTablesBuild(t *testing.T) {
	files, err := filepath.Glob("../examples/jobs/*.toml")
	if err != nil || len(files) == 0 {
		t.Fatalf("example specs: %v %v", files, err)
	}
	tables := 0
	for _, f := range files {
		s, err := Load(f)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if s.Table == nil {
			continue
		}
		tables++
		if _, _, err := s.Table.Build(s.WorldSize()); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	if tables == 0 {
		t.Error("no example spec has a [table]")
	}
}

// TestTablePacked: packed = true reaches the store spec, which then packs
// the 4-byte column; without it every block keeps 64 bytes.
func TestTablePacked(t *testing.T) {
	for _, packed := range []bool{false, true} {
		r := vocabCase(t, tableDoc(fmt.Sprintf("packed = %t\n", packed), "int32", ""))
		if r.validErr != nil || r.buildErr != nil {
			t.Fatalf("packed = %t: %v, %v", packed, r.validErr, r.buildErr)
		}
		if r.built.Packed != packed {
			t.Errorf("packed = %t: the store spec has Packed %t", packed, r.built.Packed)
		}
		s := storetest.Create(t, r.built)
		want := map[bool]int{false: 64, true: 16}[packed] // "x": 4 steps of an int32
		if got := s.BlockStride(1); got != want {
			t.Errorf("packed = %t: column x at a stride of %d, want %d", packed, got, want)
		}
	}
}

// A prioritized table's explicit priority_exponent = 0 (uniform draws over a
// prioritized table) survives Marshal, which writes the resolved spec that a
// submitted job runs from: left out, the reparse would give it the default 1.
func TestMarshalKeepsZeroPriorityExponent(t *testing.T) {
	doc := "name = \"zero\"\n[launch]\nnp = 1\ncommand = [\"a\"]\n[table]\ncapacity = 10\ntrajectory_length = 1\n" +
		"sampler = \"prioritized\"\npriority_exponent = 0.0\n[[table.columns]]\nname = \"o\"\ndtype = \"float32\"\n"
	s, err := Parse([]byte(doc), "zero.toml")
	if err != nil {
		t.Fatal(err)
	}
	if s.Table.PriorityExponent != 0 {
		t.Fatalf("parsed priority_exponent %v, want the 0 written", s.Table.PriorityExponent)
	}
	b, err := Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse(b, "zero.toml")
	if err != nil {
		t.Fatal(err)
	}
	if got := again.Table.PriorityExponent; got != 0 {
		t.Errorf("after Marshal and Parse: priority_exponent %v, want 0\n%s", got, b)
	}
}
