package store_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// fillShard inserts n rows into s and changes some statuses.
func fillShard(t *testing.T, s *store.Shard, n int, base uint64) {
	t.Helper()
	for i := range n {
		ref := insert(t, s, base+uint64(i), float64(i%13)+0.25)
		switch i % 5 {
		case 1:
			if _, err := s.MarkSampled(ref); err != nil {
				t.Fatal(err)
			}
		case 3:
			if err := s.Release(ref); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func restore(t *testing.T, path string, opts ...store.Option) *store.Shard {
	t.Helper()
	r, err := store.Restore(context.Background(), path, storetest.Name(t, "restored"), opts...)
	if err != nil {
		t.Fatalf("restore %s: %v", path, err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// tables returns a copy of every column table, up to the last block.
func tables(s *store.Shard) [][]byte {
	var out [][]byte
	for c := range s.Spec().Columns {
		n := s.BlockOffset(c, s.Capacity())
		out = append(out, bytes.Clone(s.ColumnTable(c)[:n]))
	}
	return out
}

func TestCheckpointRoundTrip(t *testing.T) {
	spec := storetest.Spec(40)
	spec.Remover = store.RemoverLIFO
	s := storetest.Create(t, spec)
	fillShard(t, s, 30, 0)
	path := filepath.Join(t.TempDir(), "shard.ckpt")
	var last, total int64
	calls := 0
	err := s.Checkpoint(context.Background(), path, store.WithFrameSize(1000), store.WithProgress(func(d, n int64) {
		if d < last || d > n {
			t.Errorf("progress %d of %d after %d", d, n, last)
		}
		last, total = d, n
		calls++
	}))
	if err != nil {
		t.Fatal(err)
	}
	if last != total || calls < 5 {
		t.Fatalf("progress ended at %d of %d after %d calls", last, total, calls)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".*tmp*")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
	r := restore(t, path, store.WithSpec(spec))
	if !bytes.Equal(storetest.Dump(r), storetest.Dump(s)) {
		t.Fatal("restored shard differs")
	}
	if r.Spec().Remover != store.RemoverLIFO || r.CommitSeq() != s.CommitSeq() {
		t.Fatalf("restored remover %q, commit seq %d (want %d)", r.Spec().Remover, r.CommitSeq(), s.CommitSeq())
	}
	if st := r.Stats(); st.Committed != 24 || st.Free != 16 {
		t.Fatalf("restored stats %+v", st)
	}
	if _, _, err := r.ReadCommits(0, nil, 1); !errors.Is(err, store.ErrMissed) {
		t.Fatalf("ReadCommits of a restored shard: %v, want ErrMissed", err)
	}
	// The restored shard goes on: new rows continue the sequence.
	ref := insert(t, r, 999, 1)
	if ref.Seq != s.CommitSeq() {
		t.Fatalf("first new row after restore has seq %d, want %d", ref.Seq, s.CommitSeq())
	}
	rows, next, err := r.ReadCommits(ref.Seq, nil, 5)
	if err != nil || len(rows) != 1 || next != ref.Seq+1 {
		t.Fatalf("ReadCommits after restore: %v %d %v", rows, next, err)
	}

	// Layout checks.
	other := storetest.Spec(40)
	other.Remover = store.RemoverLIFO
	other.Columns[1].Shape = []int{3}
	_, err = store.Restore(context.Background(), path, storetest.Name(t, "x"), store.WithSpec(other))
	if !errors.Is(err, store.ErrLayout) || !strings.Contains(err.Error(), `column "act": checkpoint has 2 int32 (length 4), spec has 3 int32 (length 4)`) {
		t.Fatalf("restore with another layout: %v", err)
	}
	before := storetest.Dump(s)
	if _, err := store.Restore(context.Background(), path, s.Name()); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("restore over an existing shard: %v", err)
	}
	if !bytes.Equal(storetest.Dump(s), before) {
		t.Fatal("failed restore touched the existing shard")
	}
}

// frameInfo locates one frame of a checkpoint file.
type frameInfo struct {
	section      uint32
	index        uint32
	hdr, payload int // offsets in the file
	clen         int
}

func parseFrames(t *testing.T, b []byte) (frames []frameInfo, end int) {
	t.Helper()
	encLen := int(binary.LittleEndian.Uint32(b[12:]))
	off := 24 + encLen + 4
	for string(b[off:off+4]) == "FRAM" {
		f := frameInfo{
			section: binary.LittleEndian.Uint32(b[off+4:]),
			index:   binary.LittleEndian.Uint32(b[off+8:]),
			hdr:     off,
			payload: off + 36,
			clen:    int(binary.LittleEndian.Uint32(b[off+24:])),
		}
		frames = append(frames, f)
		off = f.payload + f.clen
	}
	return frames, off
}

func TestCheckpointCorruptionIsRefused(t *testing.T) {
	s := storetest.Create(t, storetest.Spec(16))
	fillShard(t, s, 16, 0)
	dir := t.TempDir()
	path := filepath.Join(dir, "good.ckpt")
	if err := s.Checkpoint(context.Background(), path, store.WithFrameSize(512)); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	frames, end := parseFrames(t, good)
	if end+32 != len(good) {
		t.Fatalf("parsed to %d of %d bytes", end, len(good))
	}
	names := []string{`column "obs"`, `column "act"`, `column "meta"`}
	name := func(sec uint32) string {
		if sec == 0xFFFFFFF0 {
			return "status table"
		}
		return names[sec]
	}
	type damage struct {
		what string
		at   int    // byte to flip (-1: none)
		cut  int    // truncate to this length (0: don't)
		add  []byte // append
		want string
	}
	var cases []damage
	for _, f := range frames {
		where := fmt.Sprintf("%s frame %d", name(f.section), f.index)
		cases = append(cases,
			damage{what: "payload of " + where, at: f.payload + f.clen/2, want: where + ": checksum"},
			damage{what: "header of " + where, at: f.hdr + 21, want: where + ": frame header damaged"},
		)
	}
	cases = append(cases,
		damage{what: "magic", at: 1, want: "not a gear checkpoint"},
		damage{what: "spec", at: 30, want: "header: checksum"},
		damage{what: "end record", at: end + 9, want: "end record damaged"},
		damage{what: "truncated in a frame", at: -1, cut: frames[3].payload + 5, want: fmt.Sprintf("%s frame %d: file ends early", name(frames[3].section), frames[3].index)},
		damage{what: "truncated before the end record", at: -1, cut: end, want: "end record: file ends early"},
		damage{what: "trailing bytes", at: -1, add: []byte{0}, want: "bytes after the end record"},
		damage{what: "empty", at: -1, cut: -1, want: "header: file ends early"},
	)
	// Frames swapped: the second frame where the first should be.
	swapped := bytes.Clone(good[:frames[0].hdr])
	swapped = append(swapped, good[frames[1].hdr:frames[2].hdr]...)
	swapped = append(swapped, good[frames[0].hdr:frames[1].hdr]...)
	swapped = append(swapped, good[frames[2].hdr:]...)

	try := func(what string, b []byte, want string) {
		p := filepath.Join(dir, "bad.ckpt")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		name := storetest.Name(t, "bad")
		r, err := store.Restore(context.Background(), p, name)
		if err == nil {
			r.Close()
			t.Errorf("%s: restored", what)
			return
		}
		if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %q, want ErrCorrupt and %q", what, err, want)
		}
		if _, err := os.Stat("/dev/shm/" + name); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: segment left after a failed restore", what)
		}
	}
	for _, c := range cases {
		b := bytes.Clone(good)
		if c.at >= 0 {
			b[c.at] ^= 0x5a
		}
		switch {
		case c.cut > 0:
			b = b[:c.cut]
		case c.cut < 0:
			b = nil
		}
		b = append(b, c.add...)
		try(c.what, b, c.want)
	}
	try("frames swapped", swapped, `column "obs" frame 0: found column "act" frame 0`)
	r := restore(t, path) // the good file still restores
	if !bytes.Equal(storetest.Dump(r), storetest.Dump(s)) {
		t.Fatal("restored shard differs")
	}
}

// TestCheckpointKilled kills a checkpointing process at random points in 20 trials:
// the checkpoint file always restores whole, to the previous checkpoint's
// byte-identical contents or (if the kill came after the rename) to the new one's.
func TestCheckpointKilled(t *testing.T) {
	spec := storetest.Spec(48)
	spec.Columns[0].Shape = []int{32, 32} // 16 KiB of obs per row
	s := storetest.Create(t, spec)
	fillShard(t, s, 48, 0)
	dir := t.TempDir()
	path := filepath.Join(dir, "shard.ckpt")
	if err := s.Checkpoint(context.Background(), path); err != nil {
		t.Fatal(err)
	}
	prevFile, _ := os.ReadFile(path)
	r := restore(t, path)
	prevDump, prevTables := storetest.Dump(r), tables(r)
	if !bytes.Equal(prevDump, storetest.Dump(s)) {
		t.Fatal("first checkpoint does not restore the shard")
	}
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	const frame, pause = 64 << 10, 2 * time.Millisecond
	// How many frames a checkpoint has.
	c := startChild(t, "checkpoint", s.Name(), fmt.Sprintf("%s %d %s", filepath.Join(dir, "count.ckpt"), frame, time.Duration(0)))
	frames := 0
	for l := c.line(t); l != "done"; l = c.line(t) {
		if l == "frame" {
			frames++
		}
	}
	c.wait(t)
	os.Remove(filepath.Join(dir, "count.ckpt"))
	interrupted, completed := 0, 0
	for trial := range 20 {
		// Change the shard, so the new checkpoint differs from the previous one.
		fillShard(t, s, 7, uint64(1000*(trial+1)))
		wantDump := storetest.Dump(s)
		c := startChild(t, "checkpoint", s.Name(), fmt.Sprintf("%s %d %s", path, frame, pause))
		if got := c.line(t); got != "start" {
			t.Fatalf("checkpointer says %q", got)
		}
		// Kill it at a random point: a random part of a frame's time after its k-th
		// frame; after the last frame, while it writes the end, syncs and renames;
		// or once it is done.
		k := rng.Intn(frames + 2)
		for range min(k, frames) {
			if got := c.line(t); got != "frame" {
				t.Fatalf("checkpointer says %q", got)
			}
		}
		switch {
		case k < frames:
			time.Sleep(time.Duration(rng.Int63n(int64(pause))))
		case k == frames:
			time.Sleep(time.Duration(rng.Int63n(int64(4 * pause))))
		default:
			if got := c.line(t); got != "done" {
				t.Fatalf("checkpointer says %q", got)
			}
		}
		c.kill(t)
		cur, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		r := restore(t, path)
		if bytes.Equal(cur, prevFile) {
			if !bytes.Equal(storetest.Dump(r), prevDump) {
				t.Fatalf("trial %d: the previous checkpoint restores differently", trial)
			}
			for i, tab := range tables(r) {
				if !bytes.Equal(tab, prevTables[i]) {
					t.Fatalf("trial %d: column %d of the previous checkpoint restores differently", trial, i)
				}
			}
			interrupted++
		} else {
			if !bytes.Equal(storetest.Dump(r), wantDump) {
				t.Fatalf("trial %d: the new checkpoint does not restore the shard", trial)
			}
			completed++
		}
		// Either way the file at path is now the previous checkpoint.
		prevFile, prevDump, prevTables = cur, storetest.Dump(r), tables(r)
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// Each checkpoint removes the temporary files of killed ones.
	left, _ := filepath.Glob(filepath.Join(dir, ".*"))
	if len(left) > 1 {
		t.Errorf("temporary files left: %v", left)
	}
	if err := s.Checkpoint(context.Background(), path); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) != 0 {
		t.Errorf("temporary files left after a complete checkpoint: %v", left)
	}
	t.Logf("20 trials over checkpoints of %d frames: %d killed before the rename, %d after", frames, interrupted, completed)
	if interrupted == 0 {
		t.Error("no trial interrupted a checkpoint")
	}
}

// TestCheckpointWhileWriting checkpoints a shard that a writer process keeps
// evicting and refilling: every restored row is intact.
func TestCheckpointWhileWriting(t *testing.T) {
	s := storetest.Create(t, storetest.Spec(128))
	w := startChild(t, "writer", s.Name(), "1 1s")
	for s.CommitSeq() < 1000 {
		time.Sleep(time.Millisecond)
	}
	dir := t.TempDir()
	rows := 0
	for i := 0; i < 5; i++ {
		path := filepath.Join(dir, "ckpt"+strconv.Itoa(i))
		if err := s.Checkpoint(context.Background(), path, store.WithFrameSize(4096)); err != nil {
			t.Fatal(err)
		}
		r := restore(t, path)
		for st := range r.Rows() {
			if id := readID(t, r, st.Ref()); id != st.Key {
				t.Fatalf("restored row %v holds %d, key %d", st.Ref(), id, st.Key)
			}
			rows++
		}
		r.Close()
	}
	inserted := w.line(t)
	w.wait(t)
	t.Logf("%d restored rows checked (of %d in 5 checkpoints); the writer inserted %s rows in 1s", rows, 5*128, inserted)
}
