package cuda_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/cuda/cudatest"
)

// BenchmarkGMIChannel moves experience from an actor process to a learner
// process on one GPU, slot by slot (64 KiB each, a ring of 64), two ways:
//
//   - device: the GMI channel, a Ring in the learner's device memory opened by
//     the actor through CUDA IPC; each slot is one device-to-device copy.
//   - host: the host path, a ring of the same shape in shared host memory,
//     registered (pinned) in both processes; the actor copies each slot from
//     its device memory to the host ring, the learner from the host ring to
//     its device memory.
//
// The actor is this test binary started again (TestChannelProducerProcess).
// It runs on a real GPU, and on the fake driver with GEAR_BENCH_FAKE=1.
func BenchmarkGMIChannel(b *testing.B) {
	dev, lib := cudatest.BenchDevice(b)
	spec := cuda.RingSpec{Slots: 64, SlotBytes: 64 << 10}
	b.Run("device", func(b *testing.B) { benchDeviceChannel(b, dev, lib, spec) })
	b.Run("host", func(b *testing.B) { benchHostChannel(b, dev, lib, spec) })
}

const (
	envChanMode  = "GEAR_TEST_CHAN_MODE"
	envChanSlots = "GEAR_TEST_CHAN_SLOTS"
	envChanSpec  = "GEAR_TEST_CHAN_SPEC"
)

// chanProducer starts the actor; wait for it with waitProducer.
func chanProducer(b *testing.B, lib string, files []*os.File, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestChannelProducerProcess$")
	cmd.Env = append(os.Environ(), env...)
	if lib != "" {
		cmd.Env = append(cmd.Env, "GEAR_CUDA_LIB="+lib)
	}
	cmd.ExtraFiles = files
	out := new(bytes.Buffer)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return cmd
}

func waitProducer(b *testing.B, cmd *exec.Cmd) {
	if err := cmd.Wait(); err != nil {
		b.Fatalf("actor: %v\n%s", err, cmd.Stdout)
	}
}

func benchDeviceChannel(b *testing.B, dev *cuda.Device, lib string, spec cuda.RingSpec) {
	r, err := dev.NewRing(spec)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	h, err := r.Handle()
	if err != nil {
		b.Fatal(err)
	}
	dst, err := dev.Alloc(spec.Slots * spec.SlotBytes)
	if err != nil {
		b.Fatal(err)
	}
	defer dev.Free(dst)
	cmd := chanProducer(b, lib, nil, envChanMode+"=device", envRingHandle+"="+h.Encode(), envChanSlots+"="+strconv.Itoa(b.N+1))
	ctx := context.Background()
	if _, err := r.Take(ctx, dst, 1); err != nil { // the actor is up
		b.Fatal(err)
	}
	b.SetBytes(int64(spec.SlotBytes))
	b.ResetTimer()
	for got := 0; got < b.N; {
		n, err := r.Take(ctx, dst, spec.Slots)
		if err != nil {
			b.Fatal(err)
		}
		got += n
	}
	b.StopTimer()
	waitProducer(b, cmd)
}

// hostRing is the host path's ring: head at byte 0, tail at 64, slots from 128.
type hostRing struct {
	mem  []byte
	spec cuda.RingSpec
}

func (h hostRing) counter(off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&h.mem[off]))
}

func (h hostRing) slot(i uint64) []byte {
	at := 128 + int(i%uint64(h.spec.Slots))*h.spec.SlotBytes
	return h.mem[at : at+h.spec.SlotBytes]
}

func mapHostRing(fd int, spec cuda.RingSpec) (hostRing, error) {
	mem, err := unix.Mmap(fd, 0, 128+spec.Slots*spec.SlotBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	return hostRing{mem: mem, spec: spec}, err
}

func spin(ctx context.Context, ready func() bool) error {
	for !ready() {
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(time.Microsecond)
	}
	return nil
}

func benchHostChannel(b *testing.B, dev *cuda.Device, lib string, spec cuda.RingSpec) {
	fd, err := unix.MemfdCreate("gear-host-ring", 0)
	if err != nil {
		b.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "gear-host-ring")
	defer f.Close()
	if err := f.Truncate(int64(128 + spec.Slots*spec.SlotBytes)); err != nil {
		b.Fatal(err)
	}
	hr, err := mapHostRing(fd, spec)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(hr.mem)
	if _, err := dev.RegisterHost(hr.mem); err != nil {
		b.Fatal(err)
	}
	defer dev.UnregisterHost(hr.mem)
	dst, err := dev.Alloc(spec.SlotBytes)
	if err != nil {
		b.Fatal(err)
	}
	defer dev.Free(dst)
	cmd := chanProducer(b, lib, []*os.File{f}, envChanMode+"=host", envChanSpec+"="+strconv.Itoa(spec.Slots)+","+strconv.Itoa(spec.SlotBytes),
		envChanSlots+"="+strconv.Itoa(b.N+1))
	ctx := context.Background()
	head, tail := hr.counter(0), hr.counter(64)
	take := func() error {
		if err := spin(ctx, func() bool { return tail.Load() > head.Load() }); err != nil {
			return err
		}
		if err := dev.CopyHtoD(dst, hr.slot(head.Load())); err != nil {
			return err
		}
		head.Add(1)
		return nil
	}
	if err := take(); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(spec.SlotBytes))
	b.ResetTimer()
	for range b.N {
		if err := take(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	waitProducer(b, cmd)
}

// TestChannelProducerProcess is BenchmarkGMIChannel's actor, in a child
// process; it skips when started otherwise.
func TestChannelProducerProcess(t *testing.T) {
	mode := os.Getenv(envChanMode)
	if mode == "" {
		t.Skip("skipping: the actor of BenchmarkGMIChannel runs in a child")
	}
	n, _ := strconv.Atoi(os.Getenv(envChanSlots))
	drv, err := cuda.OpenDriver()
	if err != nil {
		t.Fatal(err)
	}
	dev := cudatest.OpenDevice(t, drv, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if mode == "device" {
		h, err := cuda.DecodeRingHandle(os.Getenv(envRingHandle))
		if err != nil {
			t.Fatal(err)
		}
		p, err := dev.OpenRing(h)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		src := cudatest.ToDevice(t, dev, make([]byte, h.Spec.SlotBytes*h.Spec.Slots))
		for put := 0; put < n; {
			k := min(h.Spec.Slots/4, n-put)
			if err := p.Put(ctx, src, k); err != nil {
				t.Fatal(err)
			}
			put += k
		}
		return
	}
	var spec cuda.RingSpec
	s := os.Getenv(envChanSpec)
	for i, c := range s {
		if c == ',' {
			spec.Slots, _ = strconv.Atoi(s[:i])
			spec.SlotBytes, _ = strconv.Atoi(s[i+1:])
		}
	}
	hr, err := mapHostRing(3, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(hr.mem)
	if _, err := dev.RegisterHost(hr.mem); err != nil {
		t.Fatal(err)
	}
	defer dev.UnregisterHost(hr.mem)
	src := cudatest.ToDevice(t, dev, make([]byte, spec.SlotBytes))
	head, tail := hr.counter(0), hr.counter(64)
	for i := uint64(0); i < uint64(n); i++ {
		if err := spin(ctx, func() bool { return i-head.Load() < uint64(spec.Slots) }); err != nil {
			t.Fatal(err)
		}
		if err := dev.CopyDtoH(hr.slot(i), src); err != nil {
			t.Fatal(err)
		}
		tail.Store(i + 1)
	}
}
