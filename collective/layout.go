package collective

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gear-rl/gear/gmi"
)

// Layout is a layout-aware reducer: GMI-DRL's three gradient reductions
// (multi-process, multi-ring, hierarchical; section 4.1 of the paper) over the
// ranks of a communicator whose GMI-to-GPU mapping is known. It runs the steps
// of gmi.ReductionSchedule for the strategy that Algorithm 1
// (gmi.ChooseStrategy) picks, or one forced by WithStrategy, each group on a
// sub-communicator of its own (Split).
//
// Host buffers (LayoutAllReduce) take the host path in every step: shared
// memory among the ranks of a host, TCP between hosts. Device buffers
// (AllReduceDevice, with WithDevice) take the device's links (NCCL, with
// package github.com/gear-rl/gear/collective/nccl) on the groups whose link is "nccl" (every
// member on a different GPU) when every rank's Device has them, and the host
// path, through a host copy, on the others; without device links (or on
// virtual GPUs from a topology file) every step takes the host path.
//
// Errors follow Comm's: a step that fails makes the whole layout fail, the
// other ranks hear of it through the bootstrap, and every later call returns
// the same error. Errors name ranks of the layout's communicator. Calls are
// serialized; Close releases the sub-communicators (not the parent).
type Layout struct {
	c        *Comm
	id       string
	mapping  gmi.Mapping
	strategy gmi.Strategy
	sched    gmi.Schedule
	steps    []layoutStep  // this rank's steps, in order
	subs     []*Comm       // owned
	groups   []DeviceGroup // owned
	dev      Device
	useNCCL  bool // device groups carry the "nccl" groups

	opMu  sync.Mutex
	seq   uint64
	busy  atomic.Bool // a call is in progress (for Close)
	stage []uint64    // host copy of a device buffer (8-byte aligned)

	failMu sync.Mutex
	cause  error
	closed bool

	unregLost   func()
	watchCancel context.CancelFunc
	wg          sync.WaitGroup
	closeOnce   sync.Once
}

// layoutStep is one step of the schedule as this rank runs it.
type layoutStep struct {
	phase string
	op    gmi.Op
	link  gmi.Link
	comm  *Comm       // the group's host communicator
	dev   DeviceGroup // the group's device group, when device links carry it
	root  int         // the group root's rank in comm (and dev)
}

// LayoutOption changes how NewLayout builds a Layout.
type LayoutOption func(*layoutConfig)

type layoutConfig struct {
	strategy  gmi.Strategy
	dev       Device
	hostLinks bool
}

// WithStrategy forces a strategy instead of Algorithm 1's choice. Multi-ring
// needs the same number of GMIs on every GPU.
func WithStrategy(s gmi.Strategy) LayoutOption {
	return func(c *layoutConfig) { c.strategy = s }
}

// WithDevice gives the layout this rank's device, for AllReduceDevice:
// nccl.ForLayout(dev, opts...) of package github.com/gear-rl/gear/collective/nccl for a CUDA
// device. When dev implements DeviceLinks and its links are available on
// every rank, the groups whose link is "nccl" get device groups
// (NewDeviceGroup: NCCL communicators); otherwise they take the host path too.
func WithDevice(dev Device) LayoutOption {
	return func(c *layoutConfig) { c.dev = dev }
}

// WithHostLinks carries the "nccl" groups over the host path too, even where
// the device has links (NCCL): to compare, or where the GPUs cannot talk to
// each other.
func WithHostLinks() LayoutOption { return func(c *layoutConfig) { c.hostLinks = true } }

// LayoutFromEnv is NewLayout with the mapping the launcher gave this rank in
// GEAR_GMI_LAYOUT (gearrun --gmi-per-gpu, a job spec's gmi_per_gpu). Without
// it, every rank of c counts as a GMI of one GPU, and the layout is a plain
// multi-process AllReduce.
func LayoutFromEnv(ctx context.Context, c *Comm, opts ...LayoutOption) (*Layout, error) {
	if c == nil {
		return nil, errNilComm
	}
	s := strings.TrimSpace(os.Getenv(gmi.EnvGMILayout))
	if s == "" {
		row := make([]int, c.size)
		copy(row, c.world)
		return NewLayout(ctx, c, gmi.Mapping{row}, opts...)
	}
	m, err := gmi.ParseMapping(s)
	if err != nil {
		return nil, fmt.Errorf("collective: %s: %w", gmi.EnvGMILayout, err)
	}
	return NewLayout(ctx, c, m, opts...)
}

// NewLayout builds the layout-aware reducer of mapping m over c. m lists world
// ranks (as GEAR_GMI_LAYOUT does), exactly the world ranks of c's members; row
// g holds the ranks on the g-th GPU. Every rank of c must call NewLayout with
// the same mapping and options (it checks, and every rank returns the error if
// one disagrees); it splits c once per step of the schedule that brings new
// groups, and builds the device groups (NCCL communicators) of the "nccl"
// groups when WithDevice gives a Device with DeviceLinks and every rank has
// them.
func NewLayout(ctx context.Context, c *Comm, m gmi.Mapping, opts ...LayoutOption) (_ *Layout, err error) {
	if c == nil {
		return nil, errNilComm
	}
	if ctx == nil {
		return nil, errors.New("collective: nil context")
	}
	var cfg layoutConfig
	for _, o := range opts {
		o(&cfg)
	}
	strategy := cfg.strategy
	if strategy == "" && m.Validate() == nil {
		strategy = gmi.ChooseStrategy(m)
	}
	l := &Layout{c: c, mapping: m, strategy: strategy, dev: cfg.dev}
	local := checkMembers(c, m)
	if local == nil {
		l.sched, local = gmi.ReductionSchedule(m, strategy)
		if local != nil {
			local = fmt.Errorf("collective: layout: %w", local)
		}
	}
	defer func() {
		if err != nil {
			l.release()
		}
	}()

	// Every rank must run the same schedule, and device links only where
	// every rank has them.
	links, _ := cfg.dev.(DeviceLinks)
	canNCCL := false
	if local == nil && links != nil && !cfg.hostLinks && hasNCCLGroup(l.sched) {
		canNCCL = links.LinksAvailable()
	}
	seq, err := l.agree(ctx, local, canNCCL)
	if err != nil {
		return nil, err
	}
	l.id = fmt.Sprintf("%s.layout%d", c.id, seq)

	// One Split per step that brings groups not seen before; a group that
	// comes again (a ring's broadcast after its reduce) keeps its
	// communicators.
	me := c.world[c.rank]
	type groupComms struct {
		comm *Comm
		dev  DeviceGroup
	}
	seen := map[string]*groupComms{} // by the group's ranks, in order; nil: not this rank's
	sig := func(g gmi.Group) string { return fmt.Sprint(g.Ranks) }
	var mine []*groupComms // of l.steps
	for _, st := range l.sched.Steps {
		color, key := Undefined, 0
		var my *gmi.Group
		fresh := 0
		for _, g := range st.Groups {
			i := slices.Index(g.Ranks, me)
			if i >= 0 {
				my = &g
			}
			if _, ok := seen[sig(g)]; ok {
				continue
			}
			if i >= 0 {
				color, key = fresh, i
			}
			fresh++
		}
		if fresh > 0 {
			sub, err := c.Split(ctx, color, key)
			if err != nil {
				return nil, err
			}
			for _, g := range st.Groups {
				if _, ok := seen[sig(g)]; !ok {
					seen[sig(g)] = nil
				}
			}
			if sub != nil {
				l.subs = append(l.subs, sub)
				seen[sig(*my)] = &groupComms{comm: sub}
			}
		}
		if my == nil {
			continue
		}
		gc := seen[sig(*my)]
		l.steps = append(l.steps, layoutStep{phase: st.Phase, op: st.Op, link: my.Link, comm: gc.comm, root: max(slices.Index(my.Ranks, my.Root), 0)})
		mine = append(mine, gc)
	}
	// Device groups (NCCL communicators) of the "nccl" groups, in step order
	// (each waits only for its members, who build theirs in the same order).
	if l.useNCCL {
		for i := range l.steps {
			st, gc := &l.steps[i], mine[i]
			if st.link != gmi.LinkNCCL {
				continue
			}
			if gc.dev == nil {
				gc.dev, err = links.NewDeviceGroup(ctx, st.comm)
				if err != nil {
					return nil, err
				}
				l.groups = append(l.groups, gc.dev)
			}
			st.dev = gc.dev
		}
	}
	l.start()
	return l, nil
}

// checkMembers checks that m is a valid mapping of exactly the world ranks of c.
func checkMembers(c *Comm, m gmi.Mapping) error {
	if err := m.Validate(); err != nil {
		return fmt.Errorf("collective: layout: %w", err)
	}
	want := slices.Sorted(slices.Values(c.world))
	var got []int
	for _, row := range m {
		got = append(got, row...)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		return fmt.Errorf("collective: layout %s names world ranks %v, but the communicator's ranks are world ranks %v", m, got, want)
	}
	return nil
}

func hasNCCLGroup(s gmi.Schedule) bool {
	for _, st := range s.Steps {
		for _, g := range st.Groups {
			if g.Link == gmi.LinkNCCL {
				return true
			}
		}
	}
	return false
}

// agree checks that every rank builds the same layout (a rank whose own
// checks failed, local, tells the others, and returns local), decides whether
// device groups carry the "nccl" groups (only if every rank has them), and
// returns a number that names the layout the same way on every rank.
func (l *Layout) agree(ctx context.Context, local error, canNCCL bool) (uint64, error) {
	c := l.c
	desc := []byte(fmt.Sprintf("layout %s, strategy %s", l.mapping, l.strategy))
	if local != nil {
		desc = []byte("an invalid layout (" + local.Error() + ")")
	}
	lens := make([]int64, 2*c.size)
	lens[2*c.rank] = int64(len(desc))
	if canNCCL {
		lens[2*c.rank+1] = 1
	}
	if err := AllGather(ctx, c, lens[2*c.rank:2*c.rank+2], lens); err != nil {
		return 0, err
	}
	longest := 0
	l.useNCCL = true
	for r := range c.size {
		longest = max(longest, int(lens[2*r]))
		l.useNCCL = l.useNCCL && lens[2*r+1] == 1
	}
	all := make([]byte, longest*c.size)
	copy(all[longest*c.rank:], desc)
	if err := AllGather(ctx, c, all[longest*c.rank:longest*(c.rank+1)], all); err != nil {
		return 0, err
	}
	if local != nil {
		return 0, local
	}
	for r := range c.size {
		theirs := all[longest*r : longest*r+int(lens[2*r])]
		if string(theirs) != string(desc) {
			return 0, fmt.Errorf("collective: ranks disagree on the layout: rank %d has %s, rank %d has %s", c.rank, desc, r, theirs)
		}
	}
	c.opMu.Lock()
	seq := c.seq
	c.opMu.Unlock()
	return seq, nil
}

func (l *Layout) abortKey() string { return "collective/" + l.id + "/abort" }

// start watches for lost ranks and for other ranks' failure notices.
func (l *Layout) start() {
	c := l.c
	if c.size == 1 {
		return
	}
	l.unregLost = c.boot.OnLost(func(w int, reason string) {
		for r, x := range c.world {
			if x == w && r != c.rank {
				l.fail(&LostError{Rank: r, WorldRank: w, Reason: reason}, false)
			}
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	l.watchCancel = cancel
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		v, err := c.boot.Wait(ctx, l.abortKey())
		if err != nil {
			return
		}
		l.fail(decodeAbort(v), false)
	}()
}

// Strategy is the reduction strategy the layout runs.
func (l *Layout) Strategy() gmi.Strategy { return l.strategy }

// Mapping is the layout's GMI-to-GPU mapping (world ranks).
func (l *Layout) Mapping() gmi.Mapping { return l.mapping }

// Schedule is the schedule the layout runs.
func (l *Layout) Schedule() gmi.Schedule { return l.sched }

// NCCL reports whether device groups (NCCL communicators) carry the "nccl"
// groups of AllReduceDevice.
func (l *Layout) NCCL() bool { return l.useNCCL }

// Comm is the communicator the layout was built on.
func (l *Layout) Comm() *Comm { return l.c }

// Err returns the error that made the layout fail, ErrClosed after Close, or nil.
func (l *Layout) Err() error {
	l.failMu.Lock()
	defer l.failMu.Unlock()
	if l.closed {
		return ErrClosed
	}
	return l.cause
}

// fail makes the layout fail with err (in terms of the layout's communicator)
// unless it failed already: every sub-communicator fails with it, so that a
// step in progress returns, and for a cause found here the other ranks are told.
func (l *Layout) fail(err error, publish bool) error {
	l.failMu.Lock()
	if l.cause != nil {
		cause := l.cause
		l.failMu.Unlock()
		return cause
	}
	l.cause = err
	publish = publish && err != ErrClosed && l.c.size > 1 && l.watchCancel != nil
	if publish {
		l.wg.Add(1)
	}
	l.failMu.Unlock()
	for _, s := range l.subs {
		s.fail(err, false)
	}
	for _, g := range l.groups {
		g.Fail(err)
	}
	if publish {
		go func() {
			defer l.wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			l.c.boot.Set(ctx, l.abortKey(), encodeAbort(l.c.rank, err))
		}()
	}
	return err
}

// stepError makes the layout fail with the error of a step, its ranks turned
// into ranks of the layout's communicator.
func (l *Layout) stepError(st *layoutStep, desc string, err error) error {
	if cause := l.Err(); cause != nil {
		return cause
	}
	world := st.comm.world
	toLayout := func(r int) int {
		if r < 0 || r >= len(world) {
			return r
		}
		return slices.Index(l.c.world, world[r])
	}
	var me *MismatchError
	var le *LostError
	var ae *AbortError
	switch {
	case errors.As(err, &me):
		err = &MismatchError{Rank: toLayout(me.Rank), Call: me.Call, PeerRank: toLayout(me.PeerRank), PeerCall: me.PeerCall, Detail: me.Detail}
	case errors.As(err, &le):
		err = &LostError{Rank: slices.Index(l.c.world, le.WorldRank), WorldRank: le.WorldRank, Reason: le.Reason}
	case errors.As(err, &ae):
		err = &AbortError{Rank: toLayout(ae.Rank), Cause: ae.Cause}
	case errors.Is(err, ErrClosed):
	default:
		err = fmt.Errorf("collective: layout %s, %s step %q: %w", desc, l.strategy, st.phase, err)
	}
	return l.fail(err, true)
}

// begin starts a call on the layout.
func (l *Layout) begin(ctx context.Context) error {
	if ctx == nil {
		return errors.New("collective: nil context")
	}
	l.opMu.Lock()
	l.busy.Store(true)
	if err := l.Err(); err != nil {
		l.end()
		return err
	}
	l.seq++
	return nil
}

func (l *Layout) end() {
	l.busy.Store(false)
	l.opMu.Unlock()
}

func (l *Layout) describe(op Op, dt DType, count int) string {
	return fmt.Sprintf("AllReduce(%v, %v, %d elements) as call %d", op, dt, count, l.seq)
}

// LayoutAllReduce replaces buf, on every rank of l, with the element-wise
// reduction by op of every rank's buf, running the layout's schedule over the
// host path. Every rank passes the same length; all end with bit-for-bit equal
// results. Sums of floats are associated as the schedule groups them, so they
// may differ in the last bits from another strategy's.
func LayoutAllReduce[T Number](ctx context.Context, l *Layout, buf []T, op Op) error {
	if l == nil {
		return errors.New("collective: nil layout")
	}
	if err := l.begin(ctx); err != nil {
		return err
	}
	defer l.end()
	for i := range l.steps {
		st := &l.steps[i]
		if err := hostStep(ctx, st, buf, op); err != nil {
			return l.stepError(st, l.describe(op, dtypeOf[T](), len(buf)), err)
		}
	}
	return nil
}

func hostStep[T Number](ctx context.Context, st *layoutStep, buf []T, op Op) error {
	switch st.op {
	case gmi.OpAllReduce:
		return AllReduce(ctx, st.comm, buf, op)
	case gmi.OpReduce:
		return Reduce(ctx, st.comm, buf, op, st.root)
	case gmi.OpBroadcast:
		return Broadcast(ctx, st.comm, buf, st.root)
	}
	return fmt.Errorf("collective: layout step %q: unknown operation %q", st.phase, st.op)
}

// hostStepBytes runs a host step on raw memory of element type dt.
func hostStepBytes(ctx context.Context, st *layoutStep, raw []byte, dt DType, op Op) error {
	switch dt {
	case Float32:
		return hostStep(ctx, st, viewAs[float32](raw), op)
	case Float64:
		return hostStep(ctx, st, viewAs[float64](raw), op)
	case Int32:
		return hostStep(ctx, st, viewAs[int32](raw), op)
	case Int64:
		return hostStep(ctx, st, viewAs[int64](raw), op)
	}
	return fmt.Errorf("collective: element type %v cannot be reduced", dt)
}

// viewAs views raw (aligned for T) as elements of T.
func viewAs[T Number](raw []byte) []T {
	var z T
	if len(raw) == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(raw))), len(raw)/int(unsafe.Sizeof(z)))
}

// AllReduceDevice is LayoutAllReduce for count elements of type dt in device
// memory at buf (on the device given by WithDevice; a cuda.DevicePtr converts:
// collective.DevicePtr(p)). Groups that device groups (NCCL) carry reduce the
// device buffer in place; the others reduce a host copy, which is made when a
// step needs it and copied back when the device needs it again. The caller's
// work on buf must be finished before the call; buf is the caller's again
// when it returns.
func (l *Layout) AllReduceDevice(ctx context.Context, buf DevicePtr, count int, dt DType, op Op) error {
	if l == nil {
		return errors.New("collective: nil layout")
	}
	if err := l.begin(ctx); err != nil {
		return err
	}
	defer l.end()
	desc := func() string { return "device " + l.describe(op, dt, count) }
	switch {
	case l.dev == nil:
		return l.fail(fmt.Errorf("collective: layout %s: no device (WithDevice)", desc()), true)
	case count < 0:
		return l.fail(fmt.Errorf("collective: layout %s: negative count", desc()), true)
	case dt != Float32 && dt != Float64 && dt != Int32 && dt != Int64 || !op.valid():
		return l.fail(fmt.Errorf("collective: layout %s: want a reduction of float32, float64, int32 or int64", desc()), true)
	}
	n := count * dt.Size()
	if need := (n + 7) / 8; len(l.stage) < need {
		l.stage = make([]uint64, need)
	}
	var host []byte
	if n > 0 {
		host = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(l.stage))), n)
	}
	onHost := false // where the current value is
	for i := range l.steps {
		st := &l.steps[i]
		var err error
		if st.dev != nil {
			if onHost {
				if err = l.dev.CopyToDevice(buf, host); err != nil {
					return l.stepError(st, desc(), err)
				}
				onHost = false
			}
			switch st.op {
			case gmi.OpAllReduce:
				err = st.dev.AllReduce(ctx, buf, count, dt, op)
			case gmi.OpReduce:
				err = st.dev.Reduce(ctx, buf, count, dt, op, st.root)
			case gmi.OpBroadcast:
				err = st.dev.Broadcast(ctx, buf, count, dt, st.root)
			}
		} else {
			if !onHost {
				if err = l.dev.CopyToHost(host, buf); err != nil {
					return l.stepError(st, desc(), err)
				}
				onHost = true
			}
			err = hostStepBytes(ctx, st, host, dt, op)
		}
		if err != nil {
			return l.stepError(st, desc(), err)
		}
	}
	if onHost {
		if err := l.dev.CopyToDevice(buf, host); err != nil {
			return l.fail(fmt.Errorf("collective: layout %s: %w", desc(), err), true)
		}
	}
	return nil
}

// release closes what NewLayout made.
func (l *Layout) release() {
	for _, g := range l.groups {
		g.Close()
	}
	closeComms(l.subs)
}

// closeComms closes communicators concurrently (a TCP communicator waits briefly
// for its peers' goodbyes).
func closeComms(comms []*Comm) {
	var wg sync.WaitGroup
	for _, c := range comms {
		if c != nil {
			wg.Go(func() { c.Close() })
		}
	}
	wg.Wait()
}

// Close releases the layout's sub-communicators and device groups; a
// call in progress on another goroutine returns ErrClosed. It does not close
// the communicator the layout was built on, and does not wait for the other
// ranks. It is idempotent.
func (l *Layout) Close() error {
	l.closeOnce.Do(func() {
		l.failMu.Lock()
		l.closed = true
		l.failMu.Unlock()
		if l.busy.Load() {
			l.fail(ErrClosed, false) // the call in progress returns
		}
		l.opMu.Lock()
		l.release()
		l.opMu.Unlock()
		if l.unregLost != nil {
			l.unregLost()
		}
		if l.watchCancel != nil {
			l.watchCancel()
		}
		l.wg.Wait()
	})
	return nil
}
