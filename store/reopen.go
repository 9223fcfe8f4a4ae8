package store

import (
	"errors"
	"fmt"
	"io/fs"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrOwnerAlive: Open found the shard's owner still running.
var ErrOwnerAlive = errors.New("store: the shard's owner is alive")

// Open takes over the existing shard name as its owner, after its previous owner
// died (a restarted trainer re-attaching to its shard): the segment must have
// exactly the layout spec (else the error wraps ErrLayout and names the column),
// be ready (not closed, not half set up), and its owner must be gone (else the
// error wraps ErrOwnerAlive). Every committed row stays as it was, with its key,
// priority, times sampled and insertion sequence; the rows that dead writers left
// half-written go back to the free queue and the Views dead processes held are
// given back, as Reclaim does, before Open returns. The commit log is kept, so a
// reader may go on with ReadCommits from 0, or walk Rows. Without such a
// segment the error wraps fs.ErrNotExist.
func Open(name string, spec Spec, opts ...Option) (*Shard, error) {
	o := collect(opts)
	if err := checkName(name); err != nil {
		return nil, err
	}
	ident, err := selfIdent()
	if err != nil {
		return nil, err
	}
	s, err := takeOver(name, spec.normalized(), o, ident)
	if err != nil {
		return nil, wrapOp(fmt.Sprintf("open %q", name), err)
	}
	return s, nil
}

// CreateOrOpen opens the shard name as its owner when it exists (Open), and
// creates it otherwise (Create). A segment left half set up by a creator that
// died is removed and made afresh. Reattached reports which happened.
func CreateOrOpen(name string, spec Spec, opts ...Option) (*Shard, error) {
	s, err := Open(name, spec, opts...)
	switch {
	case err == nil:
		return s, nil
	case errors.Is(err, fs.ErrNotExist):
	case errors.Is(err, errAbandoned):
		if rerr := Remove(name); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			return nil, errors.Join(err, rerr)
		}
	default:
		return nil, err
	}
	return Create(name, spec, opts...)
}

// Reattached reports whether this owner's handle took an existing shard over
// (Open) rather than making it (Create, Restore).
func (s *Shard) Reattached() bool { return s.reattached }

// errAbandoned: a segment whose creator died before it was ready.
var errAbandoned = errors.New("its creator died while setting it up")

func takeOver(name string, spec Spec, o options, ident uint64) (*Shard, error) {
	mem, err := openSegment(name)
	if err != nil {
		if errors.Is(err, errNotReady) {
			return nil, fmt.Errorf("%w (segment shorter than a header)", errAbandoned)
		}
		return nil, err
	}
	fail := func(err error) (*Shard, error) {
		_ = unix.Munmap(mem)
		return nil, err
	}
	ownerWord := (*atomic.Uint64)(unsafe.Pointer(&mem[offOwner]))
	owner := ownerWord.Load()
	switch st := (*atomic.Uint32)(unsafe.Pointer(&mem[offState])).Load(); st {
	case stateReady:
	case stateClosed:
		return fail(fmt.Errorf("%w by its owner (pid %d)", ErrClosed, owner>>32))
	default:
		if owner != 0 && identAlive(owner) {
			return fail(fmt.Errorf("%w: pid %d is still setting it up", ErrOwnerAlive, owner>>32))
		}
		return fail(errAbandoned)
	}
	if owner == ident {
		return fail(fmt.Errorf("this process already owns it"))
	}
	if owner != 0 && identAlive(owner) {
		return fail(fmt.Errorf("%w: pid %d", ErrOwnerAlive, owner>>32))
	}
	l, err := parseHeader(mem, int64(len(mem)))
	if err != nil {
		return fail(err)
	}
	if err := diffSpec(l.spec, spec); err != nil {
		return fail(fmt.Errorf("%w: %w", ErrLayout, err))
	}
	rem, err := pickRemover(l.spec.Remover, o.remover)
	if err != nil {
		return fail(err)
	}
	// One process takes the shard over: the one whose swap replaces the dead
	// owner's identity.
	if !ownerWord.CompareAndSwap(owner, ident) {
		return fail(fmt.Errorf("%w: another process took it over", ErrOwnerAlive))
	}
	_ = unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
	s := newShard(name, l, mem, o, rem)
	s.owner, s.reattached = true, true
	if err := s.register(ident); err != nil {
		ownerWord.CompareAndSwap(ident, owner)
		return fail(err)
	}
	// The dead owner's pending rows and pins, and those of every other dead
	// process, go back now; a later Reclaim does the same for writers that die.
	s.reclaim()
	return s, nil
}
