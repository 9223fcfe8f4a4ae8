package errmark

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"
)

func TestMark(t *testing.T) {
	sentinel := errors.New("sentinel")
	inner := fmt.Errorf("open x: %w", fs.ErrNotExist)
	err := fmt.Errorf("outer: %w", Mark(inner, sentinel))
	if err.Error() != "outer: open x: file does not exist" {
		t.Errorf("text %q: the mark's own text must not show", err)
	}
	if !errors.Is(err, sentinel) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%v matches the mark %v and what it marks %v; want both", err, errors.Is(err, sentinel), errors.Is(err, fs.ErrNotExist))
	}
	if errors.Is(inner, sentinel) {
		t.Error("marking changed the error marked")
	}
	if Mark(nil, sentinel) != nil {
		t.Error("Mark(nil) is not nil")
	}
	e := Errorf(sentinel, "bad %s %d", "name", 3)
	if e.Error() != "bad name 3" || !errors.Is(e, sentinel) || errors.Is(e, fs.ErrNotExist) {
		t.Errorf("Errorf: %q, matches sentinel %v", e, errors.Is(e, sentinel))
	}
}
