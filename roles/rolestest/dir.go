package rolestest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/gear-rl/gear/collective"
)

// DirBootstrap is a Bootstrap whose key-value exchange is a directory that
// several processes share: for tests that run ranks as child processes without a
// coordinator. It never reports lost ranks, so a test built on it sees only what
// the streams themselves notice (a broken connection, a segment without its
// owner).
type DirBootstrap struct {
	Dir      string
	RankID   int
	WorldLen int
	HostID   string
	Job      string // job ID for shared-memory segment names
}

var _ collective.Bootstrap = (*DirBootstrap)(nil)

// Rank is the caller's rank.
func (d *DirBootstrap) Rank() int { return d.RankID }

// Size is the number of ranks.
func (d *DirBootstrap) Size() int { return d.WorldLen }

// Host is the caller's host identity.
func (d *DirBootstrap) Host() string { return d.HostID }

// JobID names the job's shared-memory segments.
func (d *DirBootstrap) JobID() string { return d.Job }

func (d *DirBootstrap) path(key string) string { return filepath.Join(d.Dir, url.PathEscape(key)) }

// Set writes key's file (write-once).
func (d *DirBootstrap) Set(ctx context.Context, key string, value []byte) error {
	tmp, err := os.CreateTemp(d.Dir, ".set-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(value); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	// A hard link fails if the key exists: write-once, atomically.
	if err := os.Link(tmp.Name(), d.path(key)); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("rolestest: key %q set twice", key)
		}
		return err
	}
	return nil
}

// Wait polls for key's file.
func (d *DirBootstrap) Wait(ctx context.Context, key string) ([]byte, error) {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		v, err := os.ReadFile(d.path(key))
		if err == nil {
			return v, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, fmt.Errorf("rolestest: wait for %q: %w", key, ctx.Err())
		}
	}
}

// OnLost never calls fn: nobody watches the processes.
func (d *DirBootstrap) OnLost(fn func(rank int, reason string)) func() { return func() {} }
