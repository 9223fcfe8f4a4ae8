package collective

import (
	"context"
	"fmt"
	"sync"
)

// Loopback connects ranks that are goroutines of one process: frames pass from
// rank to rank as Go slices, with no copy and no system call. It is the transport
// of tests and of programs that run several ranks in one process. Give the same
// Loopback to the New of every rank of one world (WithLoopback); communicators
// split from those share it.
type Loopback struct {
	mu   sync.Mutex
	eps  map[string]*loopEndpoint
	pool bufPool
}

// NewLoopback returns an empty in-process network.
func NewLoopback() *Loopback { return &Loopback{eps: map[string]*loopEndpoint{}} }

type loopEndpoint struct {
	in []*frameQueue // by sender's communicator rank
}

func loopKey(comm string, rank int) string { return fmt.Sprintf("%s/%d", comm, rank) }

// register creates the inbox of (comm, rank) before the ranks exchange their
// details; connect finds the peers' inboxes afterwards.
func (lb *Loopback) register(comm string, rank, size int) error {
	ep := &loopEndpoint{in: make([]*frameQueue, size)}
	for i := range ep.in {
		ep.in[i] = newFrameQueue()
	}
	lb.mu.Lock()
	defer lb.mu.Unlock()
	k := loopKey(comm, rank)
	if _, ok := lb.eps[k]; ok {
		return fmt.Errorf("collective: loopback already has rank %d of communicator %q (one Loopback per world)", rank, comm)
	}
	lb.eps[k] = ep
	return nil
}

func (lb *Loopback) unregister(comm string, rank int) {
	lb.mu.Lock()
	delete(lb.eps, loopKey(comm, rank))
	lb.mu.Unlock()
}

type loopTransport struct {
	lb      *Loopback
	comm    string
	me      int
	links   map[int]*loopLink
	lostErr func(rank int, reason string) error
}

var _ transport = (*loopTransport)(nil)
var _ link = (*loopLink)(nil)

// connect links (comm, me) to the peers, given by communicator rank.
func (lb *Loopback) connect(comm string, me int, peers []int, maxP int, sig *signals, lostErr func(int, string) error) (*loopTransport, error) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	mine := lb.eps[loopKey(comm, me)]
	if mine == nil {
		return nil, fmt.Errorf("collective: loopback lost rank %d of communicator %q", me, comm)
	}
	t := &loopTransport{lb: lb, comm: comm, me: me, links: map[int]*loopLink{}, lostErr: lostErr}
	for _, p := range peers {
		ep := lb.eps[loopKey(comm, p)]
		if ep == nil {
			return nil, fmt.Errorf("collective: rank %d of communicator %q is not on this loopback (give every rank the same Loopback)", p, comm)
		}
		t.links[p] = &loopLink{lb: lb, sig: sig, in: mine.in[p], out: ep.in[me], maxP: maxP}
	}
	return t, nil
}

func (t *loopTransport) close(note []byte) {
	err := t.lostErr(t.me, "it closed the communicator")
	if len(note) > 0 {
		err = decodeAbort(note)
	}
	for _, l := range t.links {
		l.out.finish(err)
		if l.cur.own != nil {
			t.lb.pool.put(l.cur.own)
		}
	}
	t.lb.unregister(t.comm, t.me)
}

type loopLink struct {
	lb   *Loopback
	sig  *signals
	in   *frameQueue
	out  *frameQueue
	res  *[]byte
	cur  qframe
	maxP int
}

func (l *loopLink) maxPayload() int { return l.maxP }

func (l *loopLink) reserve(ctx context.Context, n int) ([]byte, error) {
	if l.sig.failed.Load() {
		return nil, errStopped
	}
	l.res = l.lb.pool.get(n)
	return *l.res, nil
}

func (l *loopLink) commit(_ context.Context, h header) error {
	l.out.push(qframe{h: h, buf: (*l.res)[:h.n], own: l.res})
	l.res = nil
	return nil
}

func (l *loopLink) next(ctx context.Context) (header, []byte, error) {
	f, err := l.in.pop(ctx, l.sig)
	if err != nil {
		return header{}, nil, err
	}
	l.cur = f
	return f.h, f.buf, nil
}

func (l *loopLink) release() {
	l.lb.pool.put(l.cur.own)
	l.cur = qframe{}
}

func (l *loopLink) peek() (header, bool) { return l.in.peek() }

func (l *loopLink) streams() bool { return false }
