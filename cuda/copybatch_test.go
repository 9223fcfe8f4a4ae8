package cuda_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"unsafe"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/cuda/cudatest"
)

func TestCopyBatchMergesRuns(t *testing.T) {
	var b cuda.CopyBatch
	spec := cuda.GatherSpec{BlockBytes: 256, Capacity: 16}
	// 3, 4, 5 follow one another in the table and in dst: one copy; then 9,
	// then 2 and 3 again.
	if err := b.AddGather(0x10000, 0x80000, []int64{3, 4, 5, 9, 2, 3}, nil, spec); err != nil {
		t.Fatal(err)
	}
	if b.Len() != 3 || b.Bytes() != 6*256 {
		t.Fatalf("%d copies of %d bytes, want 3 of %d", b.Len(), b.Bytes(), 6*256)
	}
	b.Reset()
	if b.Len() != 0 || b.Bytes() != 0 {
		t.Fatalf("after Reset: %d copies, %d bytes", b.Len(), b.Bytes())
	}
	// A window with padding: rows are apart in dst, so no two merge.
	spec = cuda.GatherSpec{BlockBytes: 256, Capacity: 16, FrameBytes: 16, Offset: 2, Length: 4, HeadPad: 1}
	if err := b.AddGather(0x10000, 0x80000, []int64{3, 4}, nil, spec); err != nil {
		t.Fatal(err)
	}
	if b.Len() != 2 || b.Bytes() != 2*64 {
		t.Fatalf("%d copies of %d bytes, want 2 of 128", b.Len(), b.Bytes())
	}
	if err := b.AddGather(0x10000, 0x80000, []int64{16}, nil, spec); err == nil || !strings.Contains(err.Error(), "index 16") {
		t.Fatalf("index past the table: %v", err)
	}
}

// TestCopyBatchRefusals: what the driver refuses comes back as an error that
// names the copy, a batch on the legacy stream is refused before the call,
// and a driver without batches (before CUDA 12.8) is refused naming itself.
func TestCopyBatchRefusals(t *testing.T) {
	f := openFake(t, 0)
	dev := f.dev
	ctx := context.Background()
	s := f.stream(t)
	src, sdev := mapTable(t, dev, 4096, 7)
	dst := cudatest.ToDevice(t, dev, make([]byte, 4096))
	check := func(want []byte) {
		t.Helper()
		if err := dev.StreamSynchronize(ctx, s); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 4096)
		if err := dev.CopyDtoH(got, dst); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatal("the destination is not what the batch should have left")
		}
	}
	b := new(cuda.CopyBatch)
	b.Add(dst, sdev, 1024)
	b.Add(dst.Add(2048), sdev.Add(2048), 2048)
	if err := dev.CopyBatchAsync(0, b); err == nil || !strings.Contains(err.Error(), "legacy default stream") {
		t.Fatalf("legacy stream: %v", err)
	}
	check(make([]byte, 4096))

	// Pageable memory the driver does not know, as the third copy's source.
	pageable := make([]byte, 512)
	b.Add(dst.Add(1024), cuda.DevicePtr(uintptr(unsafe.Pointer(&pageable[0]))), 512)
	err := dev.CopyBatchAsync(s, b)
	if err == nil || !strings.Contains(err.Error(), "copy 2 of 3: 512 bytes") {
		t.Fatalf("unknown source: %v", err)
	}

	f.cu.Fail("cuMemcpyBatchAsync", 2, 1) // CUDA_ERROR_OUT_OF_MEMORY
	b.Reset()
	b.Add(dst, sdev, 4096)
	if err := dev.CopyBatchAsync(s, b); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_OUT_OF_MEMORY") {
		t.Fatalf("injected failure: %v", err)
	}
	if err := dev.CopyBatchAsync(s, b); err != nil {
		t.Fatal(err)
	}
	check(src)

	// A driver before CUDA 12.8: every way in says so, naming the version.
	restore := cuda.HideCopyBatch(dev)
	if err := dev.CheckCopyBatch(); !errors.Is(err, cuda.ErrNotSupported) || !strings.Contains(err.Error(), "batches need 12.8") {
		t.Fatalf("CheckCopyBatch without batches: %v", err)
	}
	if err := dev.CopyBatchAsync(s, b); !errors.Is(err, cuda.ErrNotSupported) {
		t.Fatalf("CopyBatchAsync without batches: %v", err)
	}
	g, err := dev.NewGatherer()
	if err != nil {
		t.Fatal(err)
	}
	spec := cuda.GatherSpec{BlockBytes: 1024, Capacity: 4}
	err = g.GatherCopies(s, dst, sdev, []int64{1}, nil, spec)
	restore()
	if !errors.Is(err, cuda.ErrNotSupported) {
		t.Fatalf("GatherCopies without batches: %v", err)
	}
	if err := dev.CheckCopyBatch(); err != nil {
		t.Fatal(err)
	}

	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := g.GatherCopies(s, dst, sdev, []int64{1}, nil, spec); !errors.Is(err, cuda.ErrClosed) {
		t.Fatalf("GatherCopies after Close: %v", err)
	}
}
