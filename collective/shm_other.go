//go:build !linux

package collective

import (
	"context"
	"errors"
	"time"
)

// Shared memory needs futexes; elsewhere every peer is reached over TCP.

type shmPeer struct {
	rank int
	seg  string
	pid  int
}

type shmTransport struct{ peers []shmPeer }

func newShmTransport(me int, peers []shmPeer, ringCap, maxPayload int, spin time.Duration, yield bool, sig *signals, pool *bufPool, lost func(int, string) error) (*shmTransport, error) {
	return nil, errors.New("collective: shared memory transport needs Linux")
}
func (t *shmTransport) attach() error {
	return errors.New("collective: shared memory transport needs Linux")
}
func (t *shmTransport) unlinkOwn()             {}
func (t *shmTransport) link(int) link          { return nil }
func (t *shmTransport) close([]byte)           {}
func shmAvailable() bool                       { return false }
func boundAlone() bool                         { return false }
func shmSegmentBytes(slots, ringCap int) int64 { return 0 }
func shmCtlBytes(slots int) int64              { return 0 }
func boardBytes(n int) int64                   { return 0 }

func (t *shmTransport) boardAhead() map[int]header { return nil }

func (t *shmTransport) boardCall(ctx context.Context, h header, k kernel, buf []byte) error {
	return errors.New("collective: shared memory transport needs Linux")
}

func (t *shmTransport) usage() (size, resident int64) { return 0, 0 }
