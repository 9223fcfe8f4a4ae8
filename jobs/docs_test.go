package jobs

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// specKeys lists every key the strict decoder accepts, as dotted paths
// ("launch.min_np", "group.role", "table.columns.dtype"), from Spec's toml
// tags: a field added to Spec (or to any table under it) is in the list
// without anyone writing it here. A struct or slice of structs is a section,
// whose keys are listed instead of it; a map (env) is a key.
func specKeys(t reflect.Type, prefix string) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name == "" || name == "-" || !f.IsExported() {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
			ft = ft.Elem()
		}
		path := join(prefix, name)
		if ft.Kind() == reflect.Struct && ft != durationType && !reflect.PointerTo(ft).Implements(textUnmarshaler) {
			keys = append(keys, specKeys(ft, path)...)
			continue
		}
		keys = append(keys, path)
	}
	return keys
}

var textUnmarshaler = reflect.TypeFor[interface{ UnmarshalText([]byte) error }]()

// documentedKeys reads the key tables of docs/jobs.md: each row "| `key` |"
// belongs to the section most recently named by a heading or a line that
// starts with the section in backquotes ("### `[launch]`", "`[[table.columns]]`,
// at least one:"); rows before any section are top-level keys.
func documentedKeys(doc string) map[string]bool {
	section := regexp.MustCompile("^(?:#+ )?`\\[\\[?([a-z_.]+)\\]\\]?`")
	row := regexp.MustCompile("^\\| `([a-z_]+)` \\|")
	keys := map[string]bool{}
	current := ""
	for _, line := range strings.Split(doc, "\n") {
		if m := section.FindStringSubmatch(line); m != nil {
			current = m[1]
			continue
		}
		if strings.HasPrefix(line, "### ") {
			current = ""
			continue
		}
		if m := row.FindStringSubmatch(line); m != nil {
			keys[join(current, m[1])] = true
		}
	}
	return keys
}

// Every key that the decoder accepts, and so validate, has a row in
// docs/jobs.md's tables, in its section; and every row there is a key.
func TestDocsJobsCoversEveryKey(t *testing.T) {
	b, err := os.ReadFile("../docs/jobs.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := documentedKeys(string(b))
	accepted := specKeys(reflect.TypeFor[Spec](), "")
	if len(accepted) < 40 || !slices.Contains(accepted, "launch.min_np") || !slices.Contains(accepted, "table.rate_limiter.kind") {
		t.Fatalf("specKeys found %d keys %q; the walk over Spec is broken", len(accepted), accepted)
	}
	for _, k := range accepted {
		if !documented[k] {
			t.Errorf("docs/jobs.md has no row for key %s (its section's table needs a row | `%s` |)", k, k[strings.LastIndexByte(k, '.')+1:])
		}
	}
	for k := range documented {
		if !slices.Contains(accepted, k) {
			t.Errorf("docs/jobs.md documents %s, which the decoder refuses", k)
		}
	}
	// Each accepted key really decodes: a spec that writes it is not refused
	// as an unknown key (the walk and the decoder agree).
	for _, k := range accepted {
		if _, err := Decode([]byte(docFor(k)), "job.toml"); err != nil && strings.Contains(err.Error(), "unknown key") {
			t.Errorf("key %s: %v", k, err)
		}
	}
}

// docFor writes a TOML document that sets the dotted key k (to a value that
// may be of the wrong type: only unknown keys matter to the caller).
func docFor(k string) string {
	parts := strings.Split(k, ".")
	if len(parts) == 1 {
		return k + " = 1\n"
	}
	header := strings.Join(parts[:len(parts)-1], ".")
	switch header {
	case "group", "table.columns":
		header = "[" + header + "]"
	}
	return "[" + header + "]\n" + parts[len(parts)-1] + " = 1\n"
}
