package rank

import (
	"context"
	"fmt"
	"slices"
)

// Barrier returns once every rank of the world has called Barrier, or fails with
// a *LostError when a rank died or left first.
func (w *World) Barrier(ctx context.Context) error {
	if w.conn == nil {
		return w.checkOpen()
	}
	w.bmu.Lock()
	defer w.bmu.Unlock()
	w.gen++
	gen := w.gen
	ch := make(chan error, 1)
	w.mu.Lock()
	if err := w.usableLocked(); err != nil {
		w.mu.Unlock()
		return err
	}
	w.barrier[gen] = ch
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.barrier, gen)
		w.mu.Unlock()
	}()
	if err := w.send(msgBarrier, func(e *enc) { e.uint(gen) }); err != nil {
		return err
	}
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return fmt.Errorf("rank: barrier %d: %w", gen, ctx.Err())
	case <-w.done:
		return ErrClosed
	}
}

// Set publishes value under key to every rank. Keys are write-once per world:
// setting a key twice fails with ErrKeyExists. Values are at most 1 MiB.
func (w *World) Set(ctx context.Context, key string, value []byte) error {
	if len(key) > maxKey || len(value) > maxValue {
		return fmt.Errorf("rank: set %q: key over %d bytes or value over %d bytes", trim(key), maxKey, maxValue)
	}
	if w.conn == nil {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.closed {
			return ErrClosed
		}
		if _, ok := w.cache[key]; ok {
			return fmt.Errorf("%w: %q", ErrKeyExists, key)
		}
		w.cache[key] = slices.Clone(value)
		if ch, ok := w.local[key]; ok {
			close(ch)
			delete(w.local, key)
		}
		return nil
	}
	if _, err := w.request(ctx, msgSet, key, value); err != nil {
		return err
	}
	w.mu.Lock()
	w.cache[key] = slices.Clone(value)
	w.mu.Unlock()
	return nil
}

// Get returns the value of key and whether it has been set, without waiting.
func (w *World) Get(ctx context.Context, key string) ([]byte, bool, error) {
	w.mu.Lock()
	if v, ok := w.cache[key]; ok {
		w.mu.Unlock()
		return slices.Clone(v), true, nil
	}
	w.mu.Unlock()
	if w.conn == nil {
		return nil, false, w.checkOpen()
	}
	r, err := w.request(ctx, msgGet, key, nil)
	if err != nil || !r.found {
		return nil, false, err
	}
	w.remember(key, r.val)
	return r.val, true, nil
}

// Wait blocks until key has been set by some rank and returns its value. Once a
// rank is lost, Wait returns the *LostError for keys not yet known to the caller.
func (w *World) Wait(ctx context.Context, key string) ([]byte, error) {
	w.mu.Lock()
	if v, ok := w.cache[key]; ok {
		w.mu.Unlock()
		return slices.Clone(v), nil
	}
	if w.conn == nil {
		if w.closed {
			w.mu.Unlock()
			return nil, ErrClosed
		}
		ch, ok := w.local[key]
		if !ok {
			ch = make(chan struct{})
			w.local[key] = ch
		}
		w.mu.Unlock()
		select {
		case <-ch:
			return w.Wait(ctx, key)
		case <-ctx.Done():
			return nil, fmt.Errorf("rank: wait for %q: %w", trim(key), ctx.Err())
		case <-w.done:
			return nil, ErrClosed
		}
	}
	w.mu.Unlock()
	r, err := w.request(ctx, msgWait, key, nil)
	if err != nil {
		return nil, err
	}
	w.remember(key, r.val)
	return r.val, nil
}

func (w *World) remember(key string, val []byte) {
	w.mu.Lock()
	w.cache[key] = slices.Clone(val)
	w.mu.Unlock()
}

// request sends a set, get or wait and waits for its answer.
func (w *World) request(ctx context.Context, typ byte, key string, value []byte) (reply, error) {
	what := map[byte]string{msgSet: "set", msgGet: "get", msgWait: "wait for"}[typ]
	ch := make(chan reply, 1)
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return reply{}, ErrClosed
	}
	if typ == msgWait && w.broken != nil {
		err := w.broken
		w.mu.Unlock()
		return reply{}, fmt.Errorf("rank: wait for %q: %w", trim(key), err)
	}
	w.nextID++
	id := w.nextID
	w.pending[id] = pendingReq{ch, typ}
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.pending, id)
		w.mu.Unlock()
	}()
	err := w.send(typ, func(e *enc) {
		e.uint(id)
		e.str(key)
		if typ == msgSet {
			e.bytes(value)
		}
	})
	if err != nil {
		return reply{}, fmt.Errorf("rank: %s %q: %w", what, trim(key), err)
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return reply{}, fmt.Errorf("rank: %s %q: %w", what, trim(key), r.err)
		}
		return r, nil
	case <-ctx.Done():
		return reply{}, fmt.Errorf("rank: %s %q: %w", what, trim(key), ctx.Err())
	case <-w.done:
		return reply{}, ErrClosed
	}
}

func trim(key string) string {
	if len(key) > 64 {
		return key[:64] + "..."
	}
	return key
}
