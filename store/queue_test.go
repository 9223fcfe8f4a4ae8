package store

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// testQueue is a free queue in ordinary memory, with its bell.
func testQueue(n int) (freeQueue, []uint64) {
	mem := make([]uint64, n+24)
	head := (*atomic.Uint64)(unsafe.Pointer(&mem[0]))
	tail := (*atomic.Uint64)(unsafe.Pointer(&mem[8]))
	q := newFreeQueue(head, tail, unsafe.Pointer(&mem[16]), n)
	q.bell = newBell(unsafe.Pointer(&mem[n+16]), 0)
	return q, mem
}

func TestFreeQueueOrderAndBounds(t *testing.T) {
	q, _ := testQueue(8)
	if _, ok := q.pop(); ok {
		t.Fatal("pop from an empty queue")
	}
	for lap := range 5 { // wrap the ring several times
		for i := range 8 {
			if !q.push(uint32(lap*100 + i)) {
				t.Fatalf("lap %d: push %d refused", lap, i)
			}
		}
		if q.push(999) {
			t.Fatal("push into a full queue")
		}
		for i := range 8 {
			v, ok := q.pop()
			if !ok || v != uint32(lap*100+i) {
				t.Fatalf("lap %d: pop = %d, %v; want %d", lap, v, ok, lap*100+i)
			}
		}
		if _, ok := q.pop(); ok {
			t.Fatal("pop from an emptied queue")
		}
	}
}

// TestFreeQueueSurvivesDeadProcesses simulates a process that dies right after the
// compare-and-swap of a push or pop, before moving the counter: the others finish
// its move, and nothing blocks.
func TestFreeQueueSurvivesDeadProcesses(t *testing.T) {
	q, _ := testQueue(4)
	// A push whose tail move never happened.
	t0 := q.tail.Load()
	q.cell(t0).Store(fullCell(q.lap(t0), 7))
	if !q.push(8) {
		t.Fatal("push after a dead pusher refused")
	}
	if v, ok := q.pop(); !ok || v != 7 {
		t.Fatalf("pop = %d, %v; want the dead pusher's 7", v, ok)
	}
	// A pop whose head move never happened: its value is lost, nothing else.
	h := q.head.Load()
	q.cell(h).Store(emptyCell((q.lap(h) + 1) & lapMask))
	if _, ok := q.pop(); ok {
		t.Fatal("the dead popper's value came back")
	}
	// A pop that took the value before the pusher moved the tail.
	t1 := q.tail.Load()
	q.cell(t1).Store(emptyCell((q.lap(t1) + 1) & lapMask))
	if !q.push(9) {
		t.Fatal("push refused")
	}
	if v, ok := q.pop(); !ok || v != 9 {
		t.Fatalf("pop = %d, %v; want 9", v, ok)
	}
	if !q.empty() {
		t.Fatalf("head %d tail %d", q.head.Load(), q.tail.Load())
	}
}

// TestFreeQueueConcurrent moves 64 tokens through a queue of 64 cells from 8
// goroutines: none is lost or duplicated.
func TestFreeQueueConcurrent(t *testing.T) {
	churnTokens(t, 64, func(q *freeQueue, g int) {
		for range 20000 {
			v, ok := q.pop()
			if !ok {
				continue
			}
			if !q.push(v) {
				t.Error("push refused with a token out")
				return
			}
		}
	})
}

func TestCommitLog(t *testing.T) {
	mem := make([]uint64, 1024+8)
	g := newCommitLog((*atomic.Uint64)(unsafe.Pointer(&mem[0])), unsafe.Pointer(&mem[8]), 1024)
	for i := range 3000 {
		if seq := g.append(uint32(i % 50)); seq != uint64(i) {
			t.Fatalf("append %d got seq %d", i, seq)
		}
	}
	if _, ok := g.read(3000 - 1025); ok {
		t.Fatal("read an overwritten entry")
	}
	for p := uint64(3000 - 1024); p < 3000; p++ {
		if v, ok := g.read(p); !ok || v != uint32(p%50) {
			t.Fatalf("read(%d) = %d, %v", p, v, ok)
		}
	}
	// An entry written by a committer that died before moving the tail.
	g.cell(3000).Store(uint64(g.tag(3000))<<32 | 9)
	if e := g.end(); e != 3001 {
		t.Fatalf("end = %d, want 3001", e)
	}
	if seq := g.append(1); seq != 3001 {
		t.Fatalf("append after a dead committer got %d", seq)
	}
}

// TestBellWakesSleeper: a ring after the change wakes a sleeper whose sleep
// would otherwise last ten minutes; a ring with nobody asleep makes no call.
func TestBellWakesSleeper(t *testing.T) {
	mem := make([]uint32, 16)
	b := newBell(unsafe.Pointer(&mem[0]), 0)
	b.ring() // nobody asleep: the word stays
	if b.word.Load() != 0 {
		t.Fatalf("a ring with nobody asleep moved the word to %d", b.word.Load())
	}
	var ready atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !ready.Load() {
			b.wait(ready.Load, 10*time.Minute)
		}
	}()
	for b.sleeping.Load() == 0 {
		time.Sleep(100 * time.Microsecond)
	}
	ready.Store(true)
	b.ring()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the sleeper did not wake at the ring")
	}
	if b.word.Load() != 1 || b.sleeping.Load() != 0 {
		t.Fatalf("word %d, sleeping %d after one ring: want 1, 0", b.word.Load(), b.sleeping.Load())
	}
}

// TestCommitLogConcurrentAppends: appenders racing (as writer processes do)
// get every sequence once, with no gap, while the tail, a hint moved once a
// cache line of cells, stays within a line of the end.
func TestCommitLogConcurrentAppends(t *testing.T) {
	const writers, each = 4, 5000
	mem := make([]uint64, 1024+8)
	g := newCommitLog((*atomic.Uint64)(unsafe.Pointer(&mem[0])), unsafe.Pointer(&mem[8]), 1024)
	seqs := make([][]uint64, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				seqs[w] = append(seqs[w], g.append(uint32(w*each+i)))
			}
		}()
	}
	wg.Wait()
	var all []uint64
	for w := range writers {
		if !slices.IsSorted(seqs[w]) {
			t.Fatalf("writer %d got sequences out of order", w)
		}
		all = append(all, seqs[w]...)
	}
	slices.Sort(all)
	for i, s := range all {
		if s != uint64(i) {
			t.Fatalf("sequence %d went to append %d (a gap or a repeat)", s, i)
		}
	}
	if tail := g.tail.Load(); tail > writers*each || tail+cellsPerLine < writers*each {
		t.Fatalf("tail %d after %d appends: want within %d of the end", tail, writers*each, cellsPerLine)
	}
	if e := g.end(); e != writers*each {
		t.Fatalf("end = %d after %d appends", e, writers*each)
	}
	for p := uint64(writers*each - 1024); p < writers*each; p++ {
		if _, ok := g.read(p); !ok {
			t.Fatalf("entry %d of the last lap unreadable", p)
		}
	}
}

// TestCommitLogHints: each process appends from its own hint, the position
// after its last append, and not from the shared tail. A hint left behind
// while others appended, by a few cells or by laps of the log, still gives
// the first position not yet written: two handles on one log (as two
// processes have) get every sequence once, in turn and after idling.
func TestCommitLogHints(t *testing.T) {
	mem := make([]uint64, 1024+8)
	tail, cells := (*atomic.Uint64)(unsafe.Pointer(&mem[0])), unsafe.Pointer(&mem[8])
	a, b := newCommitLog(tail, cells, 1024), newCommitLog(tail, cells, 1024)
	want := uint64(0)
	check := func(g *commitLog, who string) {
		t.Helper()
		if seq := g.append(uint32(want % 100)); seq != want {
			t.Fatalf("%s's append got sequence %d, want %d", who, seq, want)
		}
		want++
	}
	for range 100 { // in turn
		check(&a, "a")
		check(&b, "b")
	}
	for _, gap := range []int{1, cellsPerLine - 1, cellsPerLine, 3*cellsPerLine + 5, 1024, 3000} {
		for range gap { // b idles while a appends
			check(&a, "a")
		}
		check(&b, "b")
	}
	if e := a.end(); e != want {
		t.Fatalf("end = %d after %d appends", e, want)
	}
	for p := want - 1024; p < want; p++ {
		if v, ok := a.read(p); !ok || v != uint32(p%100) {
			t.Fatalf("read(%d) = %d, %v", p, v, ok)
		}
	}
}

func TestFreeQueuePopN(t *testing.T) {
	q, _ := testQueue(8)
	if got := q.popN(nil, 4); len(got) != 0 {
		t.Fatalf("popN of an empty queue: %v", got)
	}
	next := uint32(0)
	for lap := range 4 { // wrap the ring several times
		for range 7 {
			if !q.push(next) {
				t.Fatalf("lap %d: push %d refused", lap, next)
			}
			next++
		}
		want := next - 7
		for _, n := range []int{3, 1, 5} { // the last asks for more than is left
			got := q.popN(nil, n)
			if len(got) != min(n, int(next-want)) {
				t.Fatalf("lap %d: popN(%d) = %v with %d queued", lap, n, got, next-want)
			}
			for _, v := range got {
				if v != want {
					t.Fatalf("lap %d: popN(%d) = %v: want from %d on, in order", lap, n, got, want)
				}
				want++
			}
		}
		if !q.empty() {
			t.Fatalf("lap %d: head %d tail %d after taking every index", lap, q.head.Load(), q.tail.Load())
		}
	}
	// It appends to dst.
	q.push(70)
	if got := q.popN([]uint32{1}, 4); !slices.Equal(got, []uint32{1, 70}) {
		t.Fatalf("popN onto [1] = %v", got)
	}
}

// TestFreeQueueAfterDeadPopN simulates a popN whose process died after taking
// its cells, before moving the head past them: its indices are lost, as a dead
// pop's is, and the others move the head on.
func TestFreeQueueAfterDeadPopN(t *testing.T) {
	q, _ := testQueue(4)
	for v := range uint32(3) {
		q.push(100 + v)
	}
	h := q.head.Load()
	for p := h; p < h+2; p++ { // the dead popN's two compare-and-swaps
		q.cell(p).Store(emptyCell((q.lap(p) + 1) & lapMask))
	}
	if got := q.popN(nil, 4); !slices.Equal(got, []uint32{102}) {
		t.Fatalf("popN after a dead popN = %v, want [102]", got)
	}
	if !q.empty() {
		t.Fatalf("head %d tail %d: the head did not pass the dead popN's cells", q.head.Load(), q.tail.Load())
	}
	for lap := range 3 { // around the ring: every cell is usable
		for v := range uint32(4) {
			if !q.push(uint32(lap*10) + v) {
				t.Fatalf("lap %d: push %d refused", lap, v)
			}
		}
		if got := q.popN(nil, 8); !slices.Equal(got, []uint32{uint32(lap * 10), uint32(lap*10) + 1, uint32(lap*10) + 2, uint32(lap*10) + 3}) {
			t.Fatalf("lap %d: popN = %v", lap, got)
		}
	}
	// A pop that read the head before popN moved it.
	q.push(7)
	q.push(8)
	stale := q.head.Load()
	if got := q.popN(nil, 1); !slices.Equal(got, []uint32{7}) {
		t.Fatalf("popN = %v, want [7]", got)
	}
	q.head.Store(stale) // as the stale pop sees it: it passes the taken cell
	if v, ok := q.pop(); !ok || v != 8 {
		t.Fatalf("pop with the head behind popN's = %d, %v; want 8", v, ok)
	}
}

// TestFreeQueuePopNConcurrent moves 64 tokens through a full queue of 64
// cells from goroutines that take them one or several at a time: none is lost
// or duplicated, and no push is refused.
func TestFreeQueuePopNConcurrent(t *testing.T) {
	churnTokens(t, 64, func(q *freeQueue, g int) {
		var buf []uint32
		for range 20000 {
			if g%2 == 0 {
				v, ok := q.pop()
				if ok && !q.push(v) {
					t.Error("push refused with a token out")
					return
				}
				continue
			}
			buf = q.popN(buf[:0], 1+g%5)
			for _, v := range buf {
				if !q.push(v) {
					t.Error("push refused with tokens out")
					return
				}
			}
		}
	})
}

// FuzzFreeQueue runs push, pop and popN from one goroutine against a slice:
// every index comes out once, in the order pushed, a push into a full ring
// is refused, and the ring wraps any number of times.
func FuzzFreeQueue(f *testing.F) {
	f.Add([]byte{0, 0, 1, 2, 5, 0, 8}, uint8(2))
	f.Add([]byte{0, 0, 0, 0, 0, 23, 1, 1, 0, 2}, uint8(3))
	f.Fuzz(func(t *testing.T, ops []byte, logSize uint8) {
		size := 1 << (logSize % 5)
		q, _ := testQueue(size)
		var model []uint32
		next := uint32(0)
		for i, op := range ops {
			switch op % 3 {
			case 0:
				ok := q.push(next)
				if ok != (len(model) < size) {
					t.Fatalf("op %d: push %d with %d of %d queued: %v", i, next, len(model), size, ok)
				}
				if ok {
					model = append(model, next)
				}
				next++
			case 1:
				v, ok := q.pop()
				if ok != (len(model) > 0) || (ok && v != model[0]) {
					t.Fatalf("op %d: pop = %d, %v; queued %v", i, v, ok, model)
				}
				if ok {
					model = model[1:]
				}
			default:
				n := 1 + int(op/3)%8
				got := q.popN(nil, n)
				want := model[:min(n, len(model))]
				if !slices.Equal(got, want) {
					t.Fatalf("op %d: popN(%d) = %v, want %v", i, n, got, want)
				}
				model = model[len(want):]
			}
			if q.empty() != (len(model) == 0) {
				t.Fatalf("op %d: empty() = %v with %d queued", i, q.empty(), len(model))
			}
		}
	})
}

// TestFreeQueuePushN checks a run's push: in order, bounded by the ring,
// one move of the tail, one ring of the bell, and past a cell that a pusher
// which died filled without moving the tail.
func TestFreeQueuePushN(t *testing.T) {
	q, _ := testQueue(8)
	for lap := range 4 { // wrap the ring several times
		base := uint32(lap * 100)
		if n := q.pushN([]uint32{base, base + 1, base + 2, base + 3, base + 4}); n != 5 {
			t.Fatalf("lap %d: pushN of 5 into an empty ring of 8 pushed %d", lap, n)
		}
		if n := q.pushN([]uint32{base + 5, base + 6, base + 7, base + 8}); n != 3 {
			t.Fatalf("lap %d: pushN of 4 with 3 cells left pushed %d", lap, n)
		}
		if got := q.tail.Load() - q.head.Load(); got != 8 {
			t.Fatalf("lap %d: tail %d ahead of the head, want 8", lap, got)
		}
		for i := range uint32(8) {
			if v, ok := q.pop(); !ok || v != base+i {
				t.Fatalf("lap %d: pop = %d, %v; want %d", lap, v, ok, base+i)
			}
		}
		if !q.empty() {
			t.Fatalf("lap %d: not empty after every pop", lap)
		}
	}

	// A pusher died after filling the tail's cell, before moving the tail.
	t0 := q.tail.Load()
	q.cell(t0).Store(fullCell(q.lap(t0), 7))
	if n := q.pushN([]uint32{8, 9}); n != 2 {
		t.Fatalf("pushN after a dead pusher pushed %d, want 2", n)
	}
	if q.tail.Load() != t0+3 {
		t.Fatalf("tail %d, want %d: past the dead pusher's cell and the run", q.tail.Load(), t0+3)
	}
	for _, want := range []uint32{7, 8, 9} {
		if v, ok := q.pop(); !ok || v != want {
			t.Fatalf("pop = %d, %v; want %d", v, ok, want)
		}
	}

	// One ring wakes a sleeper.
	q.bell.sleeping.Store(1)
	w := q.bell.word.Load()
	if n := q.pushN([]uint32{1, 2, 3}); n != 3 {
		t.Fatalf("pushN pushed %d, want 3", n)
	}
	if q.bell.sleeping.Load() != 0 || q.bell.word.Load() != w+1 {
		t.Fatalf("after pushN: sleeping %d, word moved by %d; want 0 and 1", q.bell.sleeping.Load(), q.bell.word.Load()-w)
	}
	if n := q.pushN(nil); n != 0 || q.bell.word.Load() != w+1 {
		t.Fatalf("pushN of nothing pushed %d and rang the bell", n)
	}
}

// TestFreeQueuePushNConcurrent moves 64 tokens through a ring of 64 cells
// from 8 goroutines, each popping a few and pushing them back as one run,
// beside plain pushes: none is lost or duplicated.
func TestFreeQueuePushNConcurrent(t *testing.T) {
	churnTokens(t, 64, func(q *freeQueue, g int) {
		var run []uint32
		for i := range 5000 {
			run = run[:0]
			for range 1 + (g+i)%4 {
				if v, ok := q.pop(); ok {
					run = append(run, v)
				}
			}
			if g%2 == 0 && len(run) > 0 {
				if !q.push(run[0]) {
					t.Error("push refused with tokens out")
					return
				}
				run = run[1:]
			}
			if n := q.pushN(run); n != len(run) {
				t.Errorf("pushN of %d tokens out pushed %d", len(run), n)
				return
			}
		}
	})
}

// checkTokens drains q and checks that it held the tokens 0 to n-1, each once.
func checkTokens(t *testing.T, q freeQueue, n int) {
	t.Helper()
	var got []int
	for {
		v, ok := q.pop()
		if !ok {
			break
		}
		got = append(got, int(v))
	}
	slices.Sort(got)
	if len(got) != n || got[0] != 0 || got[n-1] != n-1 || len(slices.Compact(got)) != n {
		t.Fatalf("tokens after the run: %v", got)
	}
}

// tokenQueue returns a queue of n cells holding the tokens 0 to n-1.
func tokenQueue(n int) freeQueue {
	q, _ := testQueue(n)
	for i := range n {
		q.push(uint32(i))
	}
	return q
}

// churnTokens runs work on 8 goroutines (g from 0) over one queue of n
// cells holding the tokens 0 to n-1, then checks that it holds each token
// once.
func churnTokens(t *testing.T, n int, work func(q *freeQueue, g int)) {
	q := tokenQueue(n)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() { work(&q, g) })
	}
	wg.Wait()
	checkTokens(t, q, n)
}
