package collective

import (
	"testing"
)

// The rings of a host's inboxes shrink so that their total grows with the
// ranks, not with their pairs, and every shrunken ring still holds the four
// chunks that validate asks of a Tuning.
func TestShmSizes(t *testing.T) {
	def := DefaultTuning()
	for _, tc := range []struct {
		local, ring, chunk int
	}{
		{1, 2 << 20, 256 << 10},
		{2, 2 << 20, 256 << 10},
		{17, 2 << 20, 256 << 10}, // 16 rings of 2 MiB: the 32 MiB cap exactly
		{18, 1 << 20, 128 << 10},
		{64, 512 << 10, 64 << 10},
		{128, 256 << 10, 32 << 10},
		{256, 128 << 10, 16 << 10},
		{4096, 16 << 10, 2 << 10}, // the floor
	} {
		ring, chunk := def.shmSizes(tc.local)
		if ring != tc.ring || chunk != tc.chunk {
			t.Errorf("%d local ranks: ring %d, chunk %d; want %d, %d", tc.local, ring, chunk, tc.ring, tc.chunk)
		}
		if ring < 4*(chunk+frameAlignment) || chunk%64 != 0 || ring%64 != 0 {
			t.Errorf("%d local ranks: ring %d cannot hold 4 chunks of %d", tc.local, ring, chunk)
		}
	}

	// No cap, and a ring already below the floor, keep the Tuning's sizes.
	nocap := def
	nocap.InboxBytes = -1
	if ring, chunk := nocap.shmSizes(256); ring != def.RingBytes || chunk != def.ChunkBytes {
		t.Errorf("InboxBytes -1: ring %d, chunk %d; want the Tuning's", ring, chunk)
	}
	tiny := def
	tiny.ChunkBytes, tiny.RingBytes = 256, 1408
	if ring, chunk := tiny.shmSizes(40000); ring != 1408 || chunk != 256 {
		t.Errorf("tiny rings at 40000 ranks: ring %d, chunk %d; want 1408, 256", ring, chunk)
	}
	small := def
	small.InboxBytes = 1 << 20
	if ring, chunk := small.shmSizes(9); ring != 128<<10 || chunk != 16<<10 {
		t.Errorf("InboxBytes 1 MiB at 9 ranks: ring %d, chunk %d; want 128 KiB, 16 KiB", ring, chunk)
	}

	if !shmAvailable() {
		return
	}
	// The budget per rank is bounded once rings shrink: from 32 to 256 ranks
	// the host's total grows 8 times (it grew 64 times with fixed rings), and
	// stays within InboxBytes per rank, plus its own (unused) slot, the rings'
	// heads, the control block and its share of the board.
	b32, b256 := ShmBytes(32, def), ShmBytes(256, def)
	if r := float64(b256) / float64(b32); r > 8.5 {
		t.Errorf("ShmBytes: %d at 32 ranks, %d at 256: grew %.1f times", b32, b256, r)
	}
	for _, n := range []int{18, 64, 128, 256, 1024} {
		ring, _ := def.shmSizes(n)
		// The host's board adds a slot per rank (and two results).
		if per := ShmBytes(n, def) / int64(n); per > defaultInboxBytes+int64(ring)+int64(n)*shmRingHdr+shmCtlBytes(n)+shmPage+boardBytes(n)/int64(n) {
			t.Errorf("%d ranks: %d bytes per rank, over the cap of %d", n, per, defaultInboxBytes)
		}
	}
	if got, want := ShmSetupBytes(256), int64(256*8192); got != want {
		t.Errorf("ShmSetupBytes(256) = %d, want %d (an 8 KiB control block per rank)", got, want)
	}
	if ShmBytes(1, def) != 0 || ShmSetupBytes(1) != 0 {
		t.Error("a single rank takes shared memory")
	}
}
