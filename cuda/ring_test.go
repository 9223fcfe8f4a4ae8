package cuda_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/cuda/cudatest"
)

// The GMI channel: a ring in device memory shared by CUDA IPC between two
// processes, against the fake driver (whose device memory is shareable
// between processes, and which refuses what the real driver refuses). The
// producer is this test binary started again (TestRingProducerProcess).

const (
	envRingHandle = "GEAR_TEST_RING_HANDLE"
	envRingSlots  = "GEAR_TEST_RING_SLOTS"
	envRingStale  = "GEAR_TEST_RING_STALE"
)

// slotValue is what slot i of the stream holds: its index in each 8 bytes.
func fillSlots(b []byte, first, slotBytes int) {
	for off := 0; off < len(b); off += 8 {
		binary.LittleEndian.PutUint64(b[off:], uint64(first+off/slotBytes))
	}
}

// startProducer runs TestRingProducerProcess in a child with the ring's
// handle, on the fake driver at lib (or the system's driver when lib is "").
func startProducer(t *testing.T, lib string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestRingProducerProcess$", "-test.v")
	cmd.Env = append(os.Environ(), env...)
	if lib != "" {
		cmd.Env = append(cmd.Env, "GEAR_CUDA_LIB="+lib)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("producer:\n%s", out.String())
		}
	})
	return cmd
}

// TestRingAcrossProcesses streams 1000 slots through a ring of 16, from a
// producer process to this one, on the fake and on a real GPU.
func TestRingAcrossProcesses(t *testing.T) {
	t.Run("fake", func(t *testing.T) {
		f := openFake(t, 0)
		ringAcrossProcesses(t, f.dev, f.libs.CUDA)
	})
	t.Run("gpu", func(t *testing.T) { ringAcrossProcesses(t, cudatest.OpenGPU(t), "") })
}

func ringAcrossProcesses(t *testing.T, dev *cuda.Device, lib string) {
	spec := cuda.RingSpec{Slots: 16, SlotBytes: 48}
	r, err := dev.NewRing(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	}()
	h, err := r.Handle()
	if err != nil {
		t.Fatal(err)
	}
	// No handle opens in the process that made it.
	if _, err := dev.OpenRing(h); err == nil {
		t.Fatal("OpenRing in the exporting process succeeded")
	}
	const total = 1000 // slots: many times around the ring, with back-pressure
	cmd := startProducer(t, lib, envRingHandle+"="+h.Encode(), envRingSlots+"="+strconv.Itoa(total))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dst := cudatest.ToDevice(t, dev, make([]byte, 7*spec.SlotBytes))
	got := 0
	for got < total {
		n, err := r.Take(ctx, dst, 7)
		if err != nil {
			t.Fatal(err)
		}
		b, err := cudatest.FromDevice[byte](dev, dst, n*spec.SlotBytes)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]byte, len(b))
		fillSlots(want, got, spec.SlotBytes)
		if !bytes.Equal(b, want) {
			t.Fatalf("slots %d..%d: got %v..., want %v...", got, got+n, b[:16], want[:16])
		}
		got += n
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("producer: %v", err)
	}
}

// A handle is refused once its memory is freed, even if the fake reuses
// the file number, and a producer that opens a handle twice is refused.
func TestRingStaleHandle(t *testing.T) {
	f := openFake(t, 0)
	r, err := f.dev.NewRing(cuda.RingSpec{Slots: 4, SlotBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	h, err := r.Handle()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := startProducer(t, f.libs.CUDA, envRingHandle+"="+h.Encode(), envRingStale+"=1")
	// The exporting process cannot open its own handle (the real driver's
	// CUDA_ERROR_INVALID_CONTEXT).
	var ce *cuda.Error
	if _, err := f.dev.OpenIPC(h.IPC); !errors.As(err, &ce) || ce.Code != cuda.ErrorInvalidContext {
		t.Errorf("OpenIPC in the exporting process: %v, want CUDA_ERROR_INVALID_CONTEXT", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("producer: %v", err)
	}
	// Only the base of an allocation is exported.
	p := cudatest.ToDevice(t, f.dev, make([]byte, 64))
	if _, err := f.dev.IPCHandle(p.Add(16)); !errors.As(err, &ce) || ce.Code != cuda.ErrorInvalidValue {
		t.Errorf("IPCHandle inside an allocation: %v", err)
	}
	if err := f.dev.CloseIPC(p); !errors.As(err, &ce) || ce.Code != cuda.ErrorInvalidValue {
		t.Errorf("CloseIPC of memory that was not opened: %v", err)
	}
}

// TestRingProducerProcess is the producer's side, run by the tests above in
// a child process; it skips when started otherwise.
func TestRingProducerProcess(t *testing.T) {
	enc := os.Getenv(envRingHandle)
	if enc == "" {
		t.Skip("skipping: the producer runs in a child of TestRingAcrossProcesses")
	}
	h, err := cuda.DecodeRingHandle(enc)
	if err != nil {
		t.Fatal(err)
	}
	drv, err := cuda.OpenDriver()
	if err != nil {
		t.Fatal(err)
	}
	dev := cudatest.OpenDevice(t, drv, 0)
	if os.Getenv(envRingStale) != "" {
		var ce *cuda.Error
		if _, err := dev.OpenRing(h); !errors.As(err, &ce) || ce.Code != cuda.ErrorInvalidValue {
			t.Fatalf("OpenRing of a freed ring: %v, want CUDA_ERROR_INVALID_VALUE", err)
		}
		return
	}
	p, err := dev.OpenRing(h)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	}()
	// The driver opens a handle twice in one process (seen on an H100 with
	// driver 580): one more reference to the mapping, which its own CloseIPC
	// drops while the ring's stays (the slots below go through it).
	again, err := dev.OpenIPC(h.IPC)
	if err != nil {
		t.Fatalf("a second OpenIPC of the handle: %v", err)
	}
	if err := dev.CopyDtoH(make([]byte, 8), again); err != nil {
		t.Fatalf("reading through the second open: %v", err)
	}
	if err := dev.CloseIPC(again); err != nil {
		t.Fatalf("CloseIPC of the second open: %v", err)
	}
	total, _ := strconv.Atoi(os.Getenv(envRingSlots))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sb := h.Spec.SlotBytes
	// Half from device memory, half from the host, in uneven pieces.
	put := 0
	for chunk := 1; put < total; chunk = chunk%23 + 1 {
		k := min(chunk, total-put)
		b := make([]byte, k*sb)
		fillSlots(b, put, sb)
		if put < total/2 {
			src := cudatest.ToDevice(t, dev, b)
			err = p.Put(ctx, src, k)
		} else {
			err = p.PutHost(ctx, b)
		}
		if err != nil {
			t.Fatal(fmt.Errorf("slots %d..%d: %w", put, put+k, err))
		}
		put += k
	}
}
