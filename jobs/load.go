package jobs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"

	"github.com/gear-rl/gear/internal/tomlerr"
	"github.com/gear-rl/gear/rank"
)

// ErrNoSpec is returned by FromEnv when the process was not launched from a job
// spec (GEAR_JOB_SPEC is unset).
var ErrNoSpec = errors.New("jobs: no job spec: " + rank.EnvJobSpec + " is not set")

// FromEnv loads the job spec the process was launched from: gearrun passes its
// path to every rank as GEAR_JOB_SPEC. It returns ErrNoSpec when the variable is
// unset, so a program can fall back to its own settings.
func FromEnv() (*Spec, error) {
	path := os.Getenv(rank.EnvJobSpec)
	if path == "" {
		return nil, ErrNoSpec
	}
	return Load(path)
}

// Load reads, decodes, defaults and validates the job spec at path. A spec
// without a name takes the file's base name without its extension.
func Load(path string) (*Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("jobs: %w", err)
	}
	return Parse(data, path)
}

// Parse decodes a job spec from TOML data in strict mode, fills in defaults and
// validates it. file names the source in errors (and gives the default name);
// it may be "". Every error starts with "jobs: ", then file:line:column where the
// decoder knows them, then the field path: an unknown key is
// "jobs: job.toml:3:1: launch.npp: unknown key".
func Parse(data []byte, file string) (*Spec, error) {
	s, err := DecodeDefaults(data, file)
	if err != nil {
		return nil, err
	}
	if s.Name == "" && file != "" {
		s.Name = strings.TrimSuffix(filepath.Base(file), filepath.Ext(file))
	}
	if err := s.Validate(); err != nil {
		return nil, prefixFile(err, file)
	}
	return s, nil
}

// Decode decodes a job spec from TOML data in strict mode, without defaults or
// validation; it is what Parse does first. Errors are as Parse's.
func Decode(data []byte, file string) (*Spec, error) {
	s, _, err := decode(data, file)
	return s, err
}

// DecodeDefaults is Decode followed by the defaults of Parse, without
// validation: a key the document writes keeps its value even when it is zero
// (`priority_exponent = 0.0` stays 0, where SetDefaults, which cannot tell it
// from a missing key, would make it 1). For callers that build and check a
// part of a spec themselves, as libgear its [table].
func DecodeDefaults(data []byte, file string) (*Spec, error) {
	s, raw, err := decode(data, file)
	if err != nil {
		return nil, err
	}
	s.setDefaults(func(key string) bool { return given(raw, key) })
	return s, nil
}

// decode decodes data into a Spec, and also into the generic tree of keys the
// document writes, which tells an explicit zero from a missing key. It reports
// every decode error it finds, not only the first: the TOML decoder stops at
// the first value of the wrong type, so decode blanks that key and value out of
// a copy of the document and decodes again, until the decoder has no more to
// say. A syntax error ends the search (nothing after it can be read).
func decode(data []byte, file string) (*Spec, map[string]any, error) {
	var raw map[string]any
	if err := toml.Unmarshal(data, &raw); err != nil {
		return nil, nil, decodeError(err, data, file)
	}
	kvs := keyValues(data)
	var found []locatedError
	doc := data
	var s Spec
	for range maxDecodeErrors {
		s = Spec{}
		dec := toml.NewDecoder(bytes.NewReader(doc))
		dec.DisallowUnknownFields()
		err := dec.Decode(&s)
		if err == nil {
			break
		}
		var strict *toml.StrictMissingError
		if errors.As(err, &strict) {
			found = append(found, strictErrors(strict, doc, file)...)
			break
		}
		var de *toml.DecodeError
		if !errors.As(err, &de) {
			found = append(found, locatedError{err: decodeError(err, doc, file)})
			break
		}
		line, col := de.Position()
		found = append(found, locatedError{line: line, col: col, err: decodeError(err, doc, file)})
		next, ok := blankKeyValue(doc, kvs, line, col)
		if !ok {
			break
		}
		doc = next
	}
	for _, fe := range checkValues(raw, reflect.TypeFor[Spec](), "") {
		line, col := 0, 0
		if kv, ok := findKeyValue(kvs, fe.Field); ok {
			line, col = kv.line, kv.col
		}
		found = append(found, locatedError{line: line, col: col, err: located(fe, file, line, col)})
	}
	if len(found) > 0 {
		slices.SortStableFunc(found, func(a, b locatedError) int {
			if a.line != b.line {
				return a.line - b.line
			}
			return a.col - b.col
		})
		errs := make([]error, len(found))
		for i, f := range found {
			errs[i] = f.err
		}
		return nil, nil, errors.Join(errs...)
	}
	return &s, raw, nil
}

// maxDecodeErrors bounds how many decode errors decode looks for in one
// document.
const maxDecodeErrors = 100

// locatedError is a decode error and where in the document it is (line 0:
// unknown).
type locatedError struct {
	line, col int
	err       error
}

// strictErrors turns the decoder's unknown keys into errors, one per key.
func strictErrors(strict *toml.StrictMissingError, data []byte, file string) []locatedError {
	out := make([]locatedError, 0, len(strict.Errors))
	for i := range strict.Errors {
		e := &strict.Errors[i]
		line, col := e.Position()
		key := tomlerr.Path(data, e.Key(), line)
		out = append(out, locatedError{line: line, col: col,
			err: fmt.Errorf("jobs: %s%s: unknown key", where(file, line, col), key)})
	}
	return out
}

// located writes a *FieldError found in the decoded tree with its position:
// "jobs: file:line:col: field: problem", unwrapping to the *FieldError.
func located(err error, file string, line, col int) error {
	at := strings.TrimSuffix(where(file, line, col), ": ")
	if at == "" {
		return err
	}
	return &fileError{file: at, err: err}
}

// keyValue is where one key = value of a document is: the position of its
// key, and the byte range from the key up to the line of the next expression
// (the parser keeps no range for a whole array or inline table, and a TOML
// expression starts on a line of its own).
type keyValue struct {
	line, col  int
	start, end int
}

// keyValues maps the dotted path of every key = value in data ("launch.np",
// "group[1].role", "table.columns[0].name") to where it is. A document the
// parser refuses gives what was read before the error.
func keyValues(data []byte) map[string]keyValue {
	out := map[string]keyValue{}
	var p unstable.Parser
	p.Reset(data)
	arrays := map[string]int{} // array table path -> how many headers so far
	prefix, last := "", ""
	for p.NextExpression() {
		e := p.Expression()
		if e.Kind != unstable.Table && e.Kind != unstable.ArrayTable && e.Kind != unstable.KeyValue {
			continue
		}
		it := e.Key()
		if !it.Next() {
			continue
		}
		first := p.Shape(it.Node().Raw).Start
		if kv, ok := out[last]; ok && last != "" {
			kv.end = first.Offset - (first.Column - 1)
			out[last] = kv
		}
		last = ""
		path := keyOf(e.Key())
		switch e.Kind {
		case unstable.ArrayTable:
			n := arrays[path]
			arrays[path] = n + 1
			prefix = fmt.Sprintf("%s[%d]", indexedPath(path, arrays), n)
		case unstable.Table:
			prefix = indexedPath(path, arrays)
		case unstable.KeyValue:
			last = join(prefix, path)
			out[last] = keyValue{line: first.Line, col: first.Column, start: first.Offset, end: len(data)}
		}
	}
	return out
}

// findKeyValue finds where field is written: its own key = value, or else
// the nearest key = value around it (an inline table or array that holds it:
// "table.columns[0].name" in `columns = [{name = ""}]`).
func findKeyValue(kvs map[string]keyValue, field string) (keyValue, bool) {
	for {
		if kv, ok := kvs[field]; ok {
			return kv, true
		}
		i := strings.LastIndexAny(field, ".[")
		if i <= 0 {
			return keyValue{}, false
		}
		field = field[:i]
	}
}

// indexedPath writes the array tables that path passes through with the index
// of their latest header: "table.columns.x" under the second [[table.columns]]
// header is "table.columns[1].x".
func indexedPath(path string, arrays map[string]int) string {
	parts := strings.Split(path, ".")
	out := ""
	for i, part := range parts {
		out = join(out, part)
		if n, ok := arrays[strings.Join(parts[:i+1], ".")]; ok && i < len(parts)-1 {
			out += fmt.Sprintf("[%d]", n-1)
		}
	}
	return out
}

// keyOf joins the parts of a key with dots.
func keyOf(it unstable.Iterator) string {
	var parts []string
	for it.Next() {
		parts = append(parts, string(it.Node().Data))
	}
	return strings.Join(parts, ".")
}

// blankKeyValue returns a copy of data with the key = value that holds the
// position line:col written over with spaces (its newlines kept, so every
// other position stays), and false when no key = value holds it.
func blankKeyValue(data []byte, kvs map[string]keyValue, line, col int) ([]byte, bool) {
	off := offsetOf(data, line, col)
	if off < 0 {
		return nil, false
	}
	for _, kv := range kvs {
		if off < kv.start || off >= kv.end {
			continue
		}
		out := bytes.Clone(data)
		for i := kv.start; i < kv.end; i++ {
			if out[i] != '\n' {
				out[i] = ' '
			}
		}
		return out, true
	}
	return nil, false
}

// offsetOf is the byte offset of line:col (both from 1) in data, or -1.
func offsetOf(data []byte, line, col int) int {
	if line < 1 || col < 1 {
		return -1
	}
	off := 0
	for l := 1; l < line; l++ {
		i := bytes.IndexByte(data[off:], '\n')
		if i < 0 {
			return -1
		}
		off += i + 1
	}
	if off+col-1 >= len(data) {
		return -1
	}
	return off + col - 1
}

// given reports whether the document decoded into raw writes the dotted key
// ("launch.np"), whatever its value.
func given(raw map[string]any, key string) bool {
	parts := strings.Split(key, ".")
	m := raw
	for i, p := range parts {
		v, ok := m[p]
		if !ok {
			return false
		}
		if i == len(parts)-1 {
			return true
		}
		if m, ok = v.(map[string]any); !ok {
			return false
		}
	}
	return false
}

// where formats the location prefix "file:line:column: ", leaving out what is
// unknown.
func where(file string, line, col int) string {
	switch {
	case file != "" && line > 0:
		return fmt.Sprintf("%s:%d:%d: ", file, line, col)
	case file != "":
		return file + ": "
	case line > 0:
		return fmt.Sprintf("line %d, column %d: ", line, col)
	}
	return ""
}

func decodeError(err error, data []byte, file string) error {
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) {
		var errs []error
		for _, e := range strictErrors(strict, data, file) {
			errs = append(errs, e.err)
		}
		return errors.Join(errs...)
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		line, col, msg := tomlerr.Describe(de, data)
		return fmt.Errorf("jobs: %s%s", where(file, line, col), msg)
	}
	return fmt.Errorf("jobs: %s%w", where(file, 0, 0), err)
}

// prefixFile puts "file: " after the "jobs: " of each line of err.
func prefixFile(err error, file string) error {
	if file == "" {
		return err
	}
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = &fileError{file: file, err: e}
	}
	return errors.Join(out...)
}

// fileError is an error about a spec file; it unwraps to the error it names the
// file for, so errors.As still finds a *FieldError.
type fileError struct {
	file string
	err  error
}

func (e *fileError) Error() string {
	msg := e.err.Error()
	if rest, ok := strings.CutPrefix(msg, "jobs: "); ok {
		return "jobs: " + e.file + ": " + rest
	}
	return "jobs: " + e.file + ": " + msg
}

func (e *fileError) Unwrap() error { return e.err }

var durationType = reflect.TypeFor[Duration]()

// checkValues reports what the decoder lets through in the tree raw of a
// document (or of the part of it at path, of type t): a Duration written as
// anything but a string (a bare integer would decode as nanoseconds, which
// nobody means), and an empty string for a field tagged jobs:"nonempty" (a
// key written as "" would otherwise stand for a missing key, and take its
// default or fail without its place). Paths name arrays of tables with their
// index: "group[1].role".
func checkValues(raw map[string]any, t reflect.Type, path string) []*FieldError {
	var errs []*FieldError
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name == "" || name == "-" {
			continue
		}
		v, ok := raw[name]
		if !ok {
			continue
		}
		p := join(path, name)
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft == durationType:
			if _, isString := v.(string); !isString {
				errs = append(errs, &FieldError{Field: p, Problem: fmt.Sprintf("want a duration string such as \"90s\", got %v", v)})
			}
		case ft.Kind() == reflect.String:
			tag, hasTag := f.Tag.Lookup("jobs")
			if s, isString := v.(string); isString && s == "" && hasTag {
				problem := "must not be empty"
				if tag == "nonempty,default" {
					problem += "; leave the key out for its default"
				}
				errs = append(errs, &FieldError{Field: p, Problem: problem})
			}
		case ft.Kind() == reflect.Struct:
			if m, ok := v.(map[string]any); ok {
				errs = append(errs, checkValues(m, ft, p)...)
			}
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			if list, ok := v.([]any); ok {
				for j, item := range list {
					if m, ok := item.(map[string]any); ok {
						errs = append(errs, checkValues(m, ft.Elem(), fmt.Sprintf("%s[%d]", p, j))...)
					}
				}
			}
		}
	}
	return errs
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// Marshal encodes s as TOML that Parse reads back to an equal Spec.
func Marshal(s *Spec) ([]byte, error) {
	var buf bytes.Buffer
	enc := toml.NewEncoder(&buf)
	enc.SetIndentTables(true)
	if err := enc.Encode(s); err != nil {
		return nil, fmt.Errorf("jobs: encode spec: %w", err)
	}
	return buf.Bytes(), nil
}
