package rank

import (
	"bufio"
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"syscall"
	"time"
)

// join dials the coordinator, proves the token and waits for the world table.
func (w *World) join(ctx context.Context, self Peer) ([]Peer, error) {
	info := w.info
	// The coordinator's own assembly timeout starts at the first arrival and ends
	// first; this one only guards against a coordinator that never answers.
	ctx, cancel := context.WithTimeout(ctx, info.RdzvTimeout+5*time.Second)
	defer cancel()
	m := joinMsg{JobID: info.JobID, Peer: self, Size: info.Size, Generation: info.Restart}
	joinFrame := m.encode()
	if len(joinFrame)+1 > maxJoinFrame {
		return nil, fmt.Errorf("rank: rendezvous: this rank's facts take %d bytes, over the limit of %d (are its endpoints small?)", len(joinFrame)+1, maxJoinFrame)
	}
	var d net.Dialer
	for backoff := 5 * time.Millisecond; ; backoff = min(2*backoff, 500*time.Millisecond) {
		nc, err := d.DialContext(ctx, "tcp", info.RdzvAddr)
		if err == nil {
			var busy bool
			if busy, err = w.handshake(ctx, nc, joinFrame); err == nil {
				break
			}
			nc.Close()
			w.conn = nil
			if !busy {
				return nil, err
			}
		} else if info.Source != SourceSlurm || ctx.Err() != nil {
			// Under SLURM the coordinator (rank 0) may start after this rank.
			return nil, fmt.Errorf("rank: rendezvous at %s: %w", info.RdzvAddr, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("rank: rendezvous at %s: %w", info.RdzvAddr, err)
		case <-time.After(backoff):
		}
	}
	return w.awaitWorld(ctx)
}

// handshake proves the token on a new connection to the coordinator and joins;
// busy reports that the coordinator turned the connection away for now.
func (w *World) handshake(ctx context.Context, nc net.Conn, joinFrame []byte) (busy bool, err error) {
	info := w.info
	w.conn = nc
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	r := bufio.NewReaderSize(nc, 8192)
	w.w = bufio.NewWriterSize(nc, 4096)
	w.reader = r
	// Until the coordinator proves the token, nothing it sends may be large.
	typ, p, err := readFrameMax(r, nil, maxHandshakeFrame)
	if err != nil {
		return false, w.ctxErr(ctx, err, "reading the coordinator's hello")
	}
	if typ == msgRefuse {
		d := dec{b: p}
		msg := d.str(maxHandshakeFrame)
		if msg == busyRefusal {
			return true, fmt.Errorf("rank: rendezvous at %s: coordinator busy", info.RdzvAddr)
		}
		return false, fmt.Errorf("rank: rendezvous at %s: refused: %s", info.RdzvAddr, msg)
	}
	if typ != msgHello || len(p) != len(wireMagic)+nonceSize || string(p[:len(wireMagic)]) != wireMagic {
		return false, fmt.Errorf("rank: rendezvous at %s: not a gear coordinator", info.RdzvAddr)
	}
	serverNonce := p[len(wireMagic):]
	auth := authMsg{Nonce: newNonce(), Rank: uint32(info.Rank)}
	copy(auth.Proof[:], clientProof(info.Token, serverNonce, auth.Nonce[:], info.JobID, info.Rank))
	w.w.Write(auth.frame())
	if err := writeFrame(w.w, msgJoin, joinFrame); err != nil {
		return false, w.ctxErr(ctx, err, "joining")
	}
	typ, p, err = readFrameMax(r, nil, maxHandshakeFrame)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			err = fmt.Errorf("%w (the coordinator closed the connection: a wrong job token, or another job's coordinator)", err)
		}
		return false, w.ctxErr(ctx, err, "waiting for the coordinator's welcome")
	}
	switch typ {
	case msgRefuse:
		d := dec{b: p}
		msg := d.str(maxHandshakeFrame)
		if msg == "job token refused" {
			return false, fmt.Errorf("%w by the coordinator at %s", ErrTokenRefused, info.RdzvAddr)
		}
		return false, fmt.Errorf("rank: rendezvous at %s: refused: %s", info.RdzvAddr, msg)
	case msgWelcome:
		d := dec{b: p}
		proof := d.bytes(64)
		if !hmac.Equal(proof, serverProof(info.Token, serverNonce, auth.Nonce[:])) {
			return false, fmt.Errorf("%w: the coordinator at %s could not prove it knows the token", ErrTokenRefused, info.RdzvAddr)
		}
	default:
		return false, fmt.Errorf("rank: rendezvous at %s: unexpected message %d", info.RdzvAddr, typ)
	}
	return false, nil
}

func (w *World) ctxErr(ctx context.Context, err error, what string) error {
	if ctx.Err() != nil {
		return fmt.Errorf("rank: rendezvous at %s: %s: %w", w.info.RdzvAddr, what, ctx.Err())
	}
	return fmt.Errorf("rank: rendezvous at %s: %s: %w", w.info.RdzvAddr, what, err)
}

// awaitWorld waits for the world table after the welcome.
func (w *World) awaitWorld(ctx context.Context) ([]Peer, error) {
	info := w.info
	nc, r := w.conn, w.reader
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	typ, p, err := readFrameMax(r, nil, worldFrameLimit(info.Size))
	if err != nil {
		return nil, w.ctxErr(ctx, err, fmt.Sprintf("waiting for the other %d ranks", info.Size-1))
	}
	switch typ {
	case msgWorld:
		peers, err := decodeWorld(p)
		if err != nil {
			return nil, err
		}
		if len(peers) != info.Size {
			return nil, fmt.Errorf("rank: rendezvous: world table has %d ranks, want %d", len(peers), info.Size)
		}
		nc.SetDeadline(time.Time{})
		w.reader = r
		return peers, nil
	case msgFail:
		d := dec{b: p}
		e := &RendezvousError{Reason: d.str(4096), Missing: d.ints(maxRanks, maxRanks)}
		if d.err != nil {
			return nil, d.err
		}
		return nil, e
	default:
		return nil, fmt.Errorf("rank: rendezvous at %s: unexpected message %d", info.RdzvAddr, typ)
	}
}

func buildRoles(peers []Peer) []Role {
	var roles []Role
	index := map[string]int{}
	for _, p := range peers {
		i, ok := index[p.Role]
		if !ok {
			i = len(roles)
			index[p.Role] = i
			roles = append(roles, Role{Name: p.Role})
		}
		roles[i].Ranks = append(roles[i].Ranks, p.Rank)
	}
	for i := range roles {
		r := roles[i].Ranks
		slices.SortStableFunc(r, func(a, b int) int { return peers[a].RoleRank - peers[b].RoleRank })
	}
	return roles
}
