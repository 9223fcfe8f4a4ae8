// Package errmark marks an error as matching a sentinel (errors.Is) while it
// keeps its own text: a package's "invalid argument" or "refused" sentinel,
// which callers test for, without the sentinel's words in every message.
package errmark

import "fmt"

type marked struct{ err, mark error }

func (e marked) Error() string        { return e.err.Error() }
func (e marked) Unwrap() error        { return e.err }
func (e marked) Is(target error) bool { return target == e.mark }

// Mark returns err, with its text, matching mark as well as whatever err
// matches; nil for a nil err.
func Mark(err, mark error) error {
	if err == nil {
		return nil
	}
	return marked{err, mark}
}

// Errorf is Mark(fmt.Errorf(format, args...), mark).
func Errorf(mark error, format string, args ...any) error {
	return marked{fmt.Errorf(format, args...), mark}
}
