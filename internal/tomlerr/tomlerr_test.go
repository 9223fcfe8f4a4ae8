package tomlerr

import (
	"testing"

	"github.com/pelletier/go-toml/v2"
)

func TestPath(t *testing.T) {
	doc := []byte(`name = "x"
[[group]]
np = 1
[[group]]   # the second
np = 2
[[group.sub]]
a = 1
[[group]]
[[group.sub]]
b = 2
["odd key"]
c = 3
`)
	for _, c := range []struct {
		key  toml.Key
		line int
		want string
	}{
		{toml.Key{"name"}, 1, "name"},
		{toml.Key{"group", "np"}, 3, "group[0].np"},
		{toml.Key{"group", "np"}, 5, "group[1].np"},
		{toml.Key{"group", "sub", "a"}, 7, "group[1].sub[0].a"},
		{toml.Key{"group", "sub", "b"}, 10, "group[2].sub[0].b"}, // a new group: its subs count afresh
		{toml.Key{"odd key", "c"}, 12, `"odd key".c`},
	} {
		if got := Path(doc, c.key, c.line); got != c.want {
			t.Errorf("Path(%v, line %d) = %q, want %q", c.key, c.line, got, c.want)
		}
	}
}

func TestDescribeMismatch(t *testing.T) {
	var v struct {
		GPU []struct {
			Memory uint64 `toml:"memory_mib"`
		} `toml:"gpu"`
	}
	doc := []byte("[[gpu]]\nmemory_mib = \"lots\"\n")
	err := toml.Unmarshal(doc, &v)
	de, ok := err.(*toml.DecodeError)
	if !ok {
		t.Fatalf("error %v (%T), want a *toml.DecodeError", err, err)
	}
	line, col, text := Describe(de, doc)
	if line != 2 || col != 14 || text != "gpu[0].memory_mib: want uint64, got TOML string" {
		t.Errorf("Describe: %d:%d %q", line, col, text)
	}
}
