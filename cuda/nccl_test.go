package cuda_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/cuda/cudatest"
)

// world is an in-process stand-in for a rank's world: a write-once key-value
// exchange and news of lost ranks.
type world struct {
	mu     sync.Mutex
	cond   *sync.Cond
	kv     map[string][]byte
	lost   map[int]func(int, string)
	nextID int
}

func newWorld() *world {
	w := &world{kv: map[string][]byte{}, lost: map[int]func(int, string){}}
	w.cond = sync.NewCond(&w.mu)
	return w
}

// member is one rank's view of the world (a cuda.KeyValue).
type member struct {
	*world
	rank int
}

func (m member) Rank() int { return m.rank }

func (w *world) Set(ctx context.Context, key string, v []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.kv[key]; ok {
		return fmt.Errorf("key %q set twice", key)
	}
	w.kv[key] = append([]byte(nil), v...)
	w.cond.Broadcast()
	return nil
}

func (w *world) Wait(ctx context.Context, key string) ([]byte, error) {
	stop := context.AfterFunc(ctx, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.cond.Broadcast()
	})
	defer stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		if v, ok := w.kv[key]; ok {
			return v, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		w.cond.Wait()
	}
}

func (w *world) OnLost(fn func(rank int, reason string)) func() {
	w.mu.Lock()
	defer w.mu.Unlock()
	id := w.nextID
	w.nextID++
	w.lost[id] = fn
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.lost, id)
	}
}

func (w *world) lose(rank int, reason string) {
	w.mu.Lock()
	fns := make([]func(int, string), 0, len(w.lost))
	for _, fn := range w.lost {
		fns = append(fns, fn)
	}
	w.mu.Unlock()
	for _, fn := range fns {
		fn(rank, reason)
	}
}

// ncclFake is a fake driver and fake NCCL of one variant.
type ncclFake struct {
	libs cudatest.Libs
	drv  *cuda.Driver
	nccl *cuda.NCCL
	cu   *cudatest.FakeCUDA
	nc   *cudatest.FakeNCCL
}

func openNCCLFake(t *testing.T, opts cudatest.Options) *ncclFake {
	t.Helper()
	libs := cudatest.Build(t, opts)
	drv, err := cuda.OpenDriver(cuda.WithLibrary(libs.CUDA))
	if err != nil {
		t.Fatal(err)
	}
	n, err := cuda.OpenNCCL(cuda.WithLibrary(libs.NCCL))
	if err != nil {
		t.Fatal(err)
	}
	return &ncclFake{libs: libs, drv: drv, nccl: n, cu: cudatest.OpenFakeCUDA(t, libs.CUDA), nc: cudatest.OpenFakeNCCL(t, libs.NCCL)}
}

// rankEnv is one rank's device, stream and communicator.
type rankEnv struct {
	dev  *cuda.Device
	s    cuda.Stream
	comm *cuda.NCCLComm
}

// makeComms creates an n-rank communicator, one goroutine per rank, each rank
// on its own Device (alternating between the fake's two devices).
func (f *ncclFake) makeComms(t *testing.T, n int) []*rankEnv {
	t.Helper()
	w := newWorld()
	envs := make([]*rankEnv, n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var g errgroup.Group
	for r := range n {
		dev, err := f.drv.Device(r % 2)
		if err != nil {
			t.Fatal(err)
		}
		s, err := dev.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		envs[r] = &rankEnv{dev: dev, s: s}
		g.Go(func() error {
			id, err := f.nccl.ShareUniqueID(ctx, member{w, r}, "comm")
			if err != nil {
				return err
			}
			envs[r].comm, err = f.nccl.NewComm(ctx, dev, id, n, r)
			return err
		})
	}
	err := g.Wait()
	t.Cleanup(func() {
		for _, e := range envs {
			if e.comm != nil {
				if err := e.comm.Close(context.Background()); err != nil && !errors.Is(err, cuda.ErrAborted) {
					t.Errorf("Close: %v", err)
				}
			}
			if err := e.dev.DestroyStream(e.s); err != nil {
				t.Error(err)
			}
			if err := e.dev.Close(); err != nil {
				t.Error(err)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return envs
}

func TestNCCLUniqueIDPassesByValue(t *testing.T) {
	for _, v := range []struct {
		name string
		opts cudatest.Options
	}{{"config", cudatest.Options{}}, {"no config", cudatest.Options{NoConfig: true}}} {
		t.Run(v.name, func(t *testing.T) {
			f := openNCCLFake(t, v.opts)
			if f.nccl.Version() != 22703 {
				t.Errorf("Version = %d", f.nccl.Version())
			}
			if f.nccl.NonBlocking() == v.opts.NoConfig {
				t.Errorf("NonBlocking = %v", f.nccl.NonBlocking())
			}
			id, err := f.nccl.NewUniqueID()
			if err != nil {
				t.Fatal(err)
			}
			made := id
			for i := range id {
				id[i] ^= byte(255 - i) // every byte distinct from its neighbours
			}
			if id == made {
				t.Fatal("pattern did not change the ID")
			}
			dev, err := f.drv.Device(0)
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			c, err := f.nccl.NewComm(context.Background(), dev, id, 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			in, ok := f.nc.LastInit()
			if !ok || in.ID != id || in.NRanks != 1 || in.Rank != 0 {
				t.Errorf("NCCL received %+v, want ID % x", in, id[:8])
			}
			if in.Config == v.opts.NoConfig {
				t.Errorf("created through config = %v", in.Config)
			}
			if in.Config && (in.Blocking != 0 || in.ConfigVersion != 21400 || in.ConfigSize != 24) {
				t.Errorf("config: blocking %d, version %d, size %d", in.Blocking, in.ConfigVersion, in.ConfigSize)
			}
			if c.NonBlocking() == v.opts.NoConfig || c.Rank() != 0 || c.Size() != 1 {
				t.Errorf("communicator %d/%d non-blocking %v", c.Rank(), c.Size(), c.NonBlocking())
			}
			if err := c.Err(); err != nil {
				t.Errorf("Err on a healthy communicator: %v", err)
			}
			if err := c.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := c.Close(context.Background()); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			if err := c.AllReduce(context.Background(), 0, 0, 0, 0, cuda.Float32, cuda.OpSum); !errors.Is(err, cuda.ErrClosed) {
				t.Errorf("AllReduce after Close: %v", err)
			}
			if m := f.nc.Count(cudatest.CountMisuse); m != 0 {
				t.Errorf("%d calls on dead communicators", m)
			}
		})
	}
}

func TestShareUniqueID(t *testing.T) {
	f := openNCCLFake(t, cudatest.Options{})
	w := newWorld()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	made := f.nc.Count(cudatest.CountUniqueIDs)
	ids := make([]cuda.UniqueID, 4)
	var g errgroup.Group
	for r := range ids {
		g.Go(func() (err error) {
			ids[r], err = f.nccl.ShareUniqueID(ctx, member{w, r}, "job/comm0")
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	for r := range ids {
		if ids[r] != ids[0] {
			t.Errorf("rank %d has another ID", r)
		}
	}
	if n := f.nc.Count(cudatest.CountUniqueIDs) - made; n != 1 {
		t.Errorf("%d IDs made, want 1 (by rank 0)", n)
	}
	// A rank that waits in vain gives up with its context.
	short, cancel2 := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel2()
	if _, err := f.nccl.ShareUniqueID(short, member{w, 1}, "never"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("waiting for a missing ID: %v", err)
	}
	_ = w.Set(ctx, "short", []byte{1, 2, 3})
	if _, err := f.nccl.ShareUniqueID(ctx, member{w, 1}, "short"); err == nil {
		t.Error("an ID of 3 bytes was accepted")
	}
}

func floats(xs ...float32) []float32 { return xs }

func readFloats(t *testing.T, dev *cuda.Device, p cuda.DevicePtr, n int) []float32 {
	t.Helper()
	out := make([]float32, n)
	if err := dev.CopyDtoH(cudatest.Bytes(out), p); err != nil {
		t.Fatal(err)
	}
	return out
}

func equalFloats(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestNCCLCollectives(t *testing.T) {
	for _, v := range []struct {
		name string
		opts cudatest.Options
	}{{"non-blocking", cudatest.Options{}}, {"blocking", cudatest.Options{NoConfig: true}}} {
		t.Run(v.name, func(t *testing.T) {
			f := openNCCLFake(t, v.opts)
			const n = 3
			envs := f.makeComms(t, n)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var g errgroup.Group
			for r, e := range envs {
				g.Go(func() error {
					dev, s, c := e.dev, e.s, e.comm
					x := float32(r + 1)
					send := cudatest.ToDevice(t, dev, floats(x, 10*x, -x, 0))
					recv := cudatest.ToDevice(t, dev, make([]float32, 4*n))
					check := func(what string, got, want []float32) error {
						if !equalFloats(got, want) {
							return fmt.Errorf("rank %d %s: got %v, want %v", r, what, got, want)
						}
						return nil
					}
					if err := c.AllReduce(ctx, s, send, recv, 4, cuda.Float32, cuda.OpSum); err != nil {
						return err
					}
					if err := check("AllReduce sum", readFloats(t, dev, recv, 4), floats(6, 60, -6, 0)); err != nil {
						return err
					}
					if err := c.AllReduce(ctx, s, send, recv, 4, cuda.Float32, cuda.OpMax); err != nil {
						return err
					}
					if err := check("AllReduce max", readFloats(t, dev, recv, 4), floats(3, 30, -1, 0)); err != nil {
						return err
					}
					if err := c.Broadcast(ctx, s, send, recv, 4, cuda.Float32, 1); err != nil {
						return err
					}
					if err := check("Broadcast", readFloats(t, dev, recv, 4), floats(2, 20, -2, 0)); err != nil {
						return err
					}
					if err := c.Reduce(ctx, s, send, recv, 4, cuda.Float32, cuda.OpProd, 2); err != nil {
						return err
					}
					if r == 2 {
						if err := check("Reduce prod", readFloats(t, dev, recv, 4), floats(6, 6000, -6, 0)); err != nil {
							return err
						}
					}
					if err := c.AllGather(ctx, s, send, recv, 4, cuda.Float32); err != nil {
						return err
					}
					if err := check("AllGather", readFloats(t, dev, recv, 12), floats(1, 10, -1, 0, 2, 20, -2, 0, 3, 30, -3, 0)); err != nil {
						return err
					}
					big := cudatest.ToDevice(t, dev, floats(x, x, x, 2*x, 2*x, 2*x))
					if err := c.ReduceScatter(ctx, s, big, recv, 2, cuda.Float32, cuda.OpSum); err != nil {
						return err
					}
					want := [][]float32{floats(6, 6), floats(6, 12), floats(12, 12)}[r]
					if err := check("ReduceScatter", readFloats(t, dev, recv, 2), want); err != nil {
						return err
					}
					// A ring: everyone sends to the next and receives from the
					// previous, in one group.
					next, prev := (r+1)%n, (r+n-1)%n
					if err := c.SendRecv(ctx, s,
						cuda.P2P{Send: true, Peer: next, Buf: send, Count: 4, DType: cuda.Float32},
						cuda.P2P{Peer: prev, Buf: recv, Count: 4, DType: cuda.Float32}); err != nil {
						return err
					}
					p := float32(prev + 1)
					return check("SendRecv", readFloats(t, dev, recv, 4), floats(p, 10*p, -p, 0))
				})
			}
			if err := g.Wait(); err != nil {
				t.Fatal(err)
			}
			// Send and Recv alone, between ranks 0 and 2.
			g = errgroup.Group{}
			g.Go(func() error {
				buf := cudatest.ToDevice(t, envs[0].dev, floats(7, 8))
				return envs[0].comm.Send(ctx, envs[0].s, buf, 2, cuda.Float32, 2)
			})
			got := cudatest.ToDevice(t, envs[2].dev, floats(0, 0))
			g.Go(func() error { return envs[2].comm.Recv(ctx, envs[2].s, got, 2, cuda.Float32, 0) })
			if err := g.Wait(); err != nil {
				t.Fatal(err)
			}
			if v := readFloats(t, envs[2].dev, got, 2); !equalFloats(v, floats(7, 8)) {
				t.Errorf("Recv got %v", v)
			}
			if err := envs[0].comm.Send(ctx, envs[0].s, got, 2, cuda.Float32, 9); err == nil {
				t.Error("Send to rank 9 of 3 succeeded")
			}
			if m := f.nc.Count(cudatest.CountMisuse); m != 0 {
				t.Errorf("%d calls on dead communicators", m)
			}
		})
	}
}

func TestNCCLAbortsOnContext(t *testing.T) {
	f := openNCCLFake(t, cudatest.Options{})
	envs := f.makeComms(t, 2)
	aborts := f.nc.Count(cudatest.CountAborts)
	buf := cudatest.ToDevice(t, envs[0].dev, floats(1, 2))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	// Rank 1 never joins the collective: rank 0 must not hang.
	err := envs[0].comm.AllReduce(ctx, envs[0].s, buf, buf, 2, cuda.Float32, cuda.OpSum)
	if !errors.Is(err, cuda.ErrAborted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AllReduce without its peer: got %v, want ErrAborted and DeadlineExceeded", err)
	}
	if n := f.nc.Count(cudatest.CountAborts) - aborts; n != 1 {
		t.Errorf("%d aborts, want 1", n)
	}
	if done, err := envs[0].dev.StreamDone(envs[0].s); !done || err != nil {
		t.Errorf("the aborted collective still holds the stream: %v, %v", done, err)
	}
	err = envs[0].comm.AllReduce(context.Background(), envs[0].s, buf, buf, 2, cuda.Float32, cuda.OpSum)
	if !errors.Is(err, cuda.ErrAborted) {
		t.Errorf("AllReduce after the abort: %v", err)
	}
	// The peer learns of it as a remote error and aborts too, instead of
	// waiting for a rank that is gone.
	buf1 := cudatest.ToDevice(t, envs[1].dev, floats(1, 2))
	err = envs[1].comm.AllReduce(context.Background(), envs[1].s, buf1, buf1, 2, cuda.Float32, cuda.OpSum)
	var nerr *cuda.NCCLError
	if !errors.Is(err, cuda.ErrAborted) || !errors.As(err, &nerr) || nerr.Code != cuda.NCCLRemoteError {
		t.Errorf("the peer's AllReduce: got %v, want an abort caused by ncclRemoteError", err)
	}
	if m := f.nc.Count(cudatest.CountMisuse); m != 0 {
		t.Errorf("%d calls on dead communicators", m)
	}
}

func TestNCCLAbortsOnLostPeer(t *testing.T) {
	f := openNCCLFake(t, cudatest.Options{})
	envs := f.makeComms(t, 2)
	w := newWorld()
	unregister := envs[0].comm.AbortOnLost(w.OnLost)
	defer unregister()
	buf := cudatest.ToDevice(t, envs[0].dev, floats(1, 2))
	done := make(chan error, 1)
	go func() {
		done <- envs[0].comm.AllReduce(context.Background(), envs[0].s, buf, buf, 2, cuda.Float32, cuda.OpSum)
	}()
	select {
	case err := <-done:
		t.Fatalf("AllReduce returned before its peer (%v)", err)
	case <-time.After(20 * time.Millisecond):
	}
	w.lose(1, "exit status 3")
	select {
	case err := <-done:
		var lost *cuda.PeerLostError
		if !errors.Is(err, cuda.ErrAborted) || !errors.As(err, &lost) || lost.Rank != 1 {
			t.Fatalf("got %v, want an abort caused by the loss of rank 1", err)
		}
		if want := "cuda: ncclAllReduce: NCCL communicator aborted: cuda: rank 1 lost: exit status 3"; err.Error() != want {
			t.Errorf("error text\n got %q\nwant %q", err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("AllReduce still waiting 10s after its peer was lost")
	}
}

func TestNCCLCreationAbortsOnContext(t *testing.T) {
	f := openNCCLFake(t, cudatest.Options{})
	dev, err := f.drv.Device(0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	id, err := f.nccl.NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	aborts := f.nc.Count(cudatest.CountAborts)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	// Rank 1 of 2 never comes.
	if _, err := f.nccl.NewComm(ctx, dev, id, 2, 0); !errors.Is(err, cuda.ErrAborted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("NewComm without its peer: %v", err)
	}
	if n := f.nc.Count(cudatest.CountAborts) - aborts; n != 1 {
		t.Errorf("%d aborts, want 1", n)
	}
	if _, err := f.nccl.NewComm(context.Background(), dev, id, 2, 5); err == nil {
		t.Error("rank 5 of 2 accepted")
	}
}

func TestNCCLOnGPU(t *testing.T) {
	dev := cudatest.OpenGPU(t)
	n, err := cuda.OpenNCCL()
	if errors.Is(err, cuda.ErrNoNCCL) {
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	v := n.Version() // NCCL_VERSION_CODE: major*10000 + minor*100 + patch
	t.Logf("NCCL version %d.%d.%d (%s)", v/10000, v/100%100, v%100, n.Path())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id, err := n.NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	c, err := n.NewComm(ctx, dev, id, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Close(ctx); err != nil {
			t.Error(err)
		}
	}()
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer dev.DestroyStream(s)
	x := floats(1, 2.5, -3, float32(math.Pi))
	send := cudatest.ToDevice(t, dev, x)
	recv := cudatest.ToDevice(t, dev, make([]float32, 4))
	if err := c.AllReduce(ctx, s, send, recv, 4, cuda.Float32, cuda.OpSum); err != nil {
		t.Fatal(err)
	}
	if got := readFloats(t, dev, recv, 4); !equalFloats(got, x) {
		t.Errorf("AllReduce of one rank: %v, want %v", got, x)
	}
	if err := c.AllGather(ctx, s, send, recv, 4, cuda.Float32); err != nil {
		t.Fatal(err)
	}
	if err := c.Broadcast(ctx, s, send, recv, 4, cuda.Float32, 0); err != nil {
		t.Fatal(err)
	}
	if got := readFloats(t, dev, recv, 4); !equalFloats(got, x) {
		t.Errorf("Broadcast of one rank: %v, want %v", got, x)
	}
}
