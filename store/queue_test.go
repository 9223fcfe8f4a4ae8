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
	q, _ := testQueue(64)
	for i := range 64 {
		q.push(uint32(i))
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
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
	wg.Wait()
	var got []int
	for {
		v, ok := q.pop()
		if !ok {
			break
		}
		got = append(got, int(v))
	}
	slices.Sort(got)
	if len(got) != 64 || got[0] != 0 || got[63] != 63 || len(slices.Compact(got)) != 64 {
		t.Fatalf("tokens after the run: %v", got)
	}
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
	if tail := g.tail.Load(); tail > writers*each || tail+logLine < writers*each {
		t.Fatalf("tail %d after %d appends: want within %d of the end", tail, writers*each, logLine)
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
