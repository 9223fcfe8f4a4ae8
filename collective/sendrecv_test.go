package collective_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/collective/collectivetest"
)

// swapBuffers are the buffers rank r sends to rank peer in SendRecv: sizes
// from empty to several chunks, a pattern naming both ranks.
func swapBuffers(r, peer int, chunk int) [][]byte {
	sizes := []int{0, 1, 100, chunk - 1, chunk, chunk + 1, 3*chunk + 17, 64}
	out := make([][]byte, len(sizes))
	for i, n := range sizes {
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(r*37 + peer*11 + i*5 + j)
		}
		out[i] = b
	}
	return out
}

// TestSendRecv: every pair of ranks swaps lists of buffers, over every
// transport, with Send traffic of another tag around it; a pair whose buffers
// differ gets a mismatch.
func TestSendRecv(t *testing.T) {
	for _, tr := range collectivetest.Transports {
		for tname, tuning := range tunings() {
			t.Run(tr+"/"+tname, func(t *testing.T) {
				tuning := tuning
				comms, _ := collectivetest.Comms(t, 3, collectivetest.Config{Transport: tr, Tuning: &tuning})
				errs := collectivetest.Each(context.Background(), comms, func(ctx context.Context, c *collective.Comm) error {
					r := c.Rank()
					// Pairs (0,1), then (1,2), then (0,2): every rank takes part
					// in the pairs it belongs to, in this order.
					for _, pair := range [][2]int{{0, 1}, {1, 2}, {0, 2}} {
						if pair[0] != r && pair[1] != r {
							continue
						}
						peer := pair[0] + pair[1] - r
						if err := collective.Send(ctx, c, []byte{byte(r)}, peer, 9); err != nil {
							return err
						}
						send := swapBuffers(r, peer, tuning.ChunkBytes)
						recv := make([][]byte, len(send))
						for i, b := range swapBuffers(peer, r, tuning.ChunkBytes) {
							recv[i] = make([]byte, len(b))
						}
						if err := collective.SendRecv(ctx, c, send, recv, peer, 3); err != nil {
							return err
						}
						for i, b := range swapBuffers(peer, r, tuning.ChunkBytes) {
							if !bytes.Equal(recv[i], b) {
								return fmt.Errorf("rank %d: buffer %d from rank %d differs", r, i, peer)
							}
						}
						got := []byte{0}
						if err := collective.Recv(ctx, c, got, peer, 9); err != nil {
							return err
						}
						if got[0] != byte(peer) {
							return fmt.Errorf("rank %d: tag 9 from rank %d says %d", r, peer, got[0])
						}
					}
					return c.Barrier(ctx)
				})
				if errs != nil {
					t.Fatal(errs)
				}
			})
		}
		t.Run(tr+"/mismatch", func(t *testing.T) {
			comms, _ := collectivetest.Comms(t, 2, collectivetest.Config{Transport: tr})
			errs := errorsOf(t, comms, func(ctx context.Context, c *collective.Comm) error {
				n := 10
				if c.Rank() == 1 {
					n = 12
				}
				send := [][]byte{make([]byte, n)}
				recv := [][]byte{make([]byte, 10)}
				return collective.SendRecv(ctx, c, send, recv, 1-c.Rank(), 4)
			})
			// Rank 0 expects 10 bytes and gets 12.
			if !errors.Is(errs[0], collective.ErrMismatch) || !strings.Contains(errs[0].Error(), "got frame 0 of 12 bytes, want frame 0 of 10 bytes") {
				t.Errorf("rank 0: %v", errs[0])
			}
		})
	}
}

// TestTCPParked runs the suite's cases over TCP with Tuning.Spin 0: every
// wait parks at once, so that the links' reader goroutines read every frame,
// posted receives included, and hand reading back and forth with the calls.
func TestTCPParked(t *testing.T) {
	for tname, tuning := range tunings() {
		for _, n := range []int{2, 3} {
			t.Run(fmt.Sprintf("%s/np=%d", tname, n), func(t *testing.T) {
				tuning := tuning
				tuning.Spin = 0
				comms, _ := collectivetest.Comms(t, n, collectivetest.Config{Transport: collectivetest.TCP, Tuning: &tuning})
				for _, count := range counts(n, tname) {
					for _, tc := range caseList(n, count) {
						if errs := collectivetest.Each(context.Background(), comms, tc.fn); errs != nil {
							t.Fatalf("%s count=%d: %v", tc.name, count, errs)
						}
					}
				}
				errs := collectivetest.Each(context.Background(), comms, func(ctx context.Context, c *collective.Comm) error {
					if c.Rank() > 1 {
						return nil
					}
					peer := 1 - c.Rank()
					send := swapBuffers(c.Rank(), peer, tuning.ChunkBytes)
					want := swapBuffers(peer, c.Rank(), tuning.ChunkBytes)
					recv := make([][]byte, len(want))
					for i, b := range want {
						recv[i] = make([]byte, len(b))
					}
					if err := collective.SendRecv(ctx, c, send, recv, peer, 5); err != nil {
						return err
					}
					for i := range want {
						if !bytes.Equal(recv[i], want[i]) {
							return fmt.Errorf("rank %d: buffer %d differs", c.Rank(), i)
						}
					}
					return nil
				})
				if errs != nil {
					t.Fatal(errs)
				}
			})
		}
	}
}

// TestSendCycleOverTCP: three ranks over TCP each Send a message larger than
// the sockets hold to the next rank before they Recv from the previous one,
// right after a token went around the same ring (so that the reader of every
// link the big ones take is paused for the call that read it). Every Send blocks until its receiver reads; the receiver
// reads only once its own Send is done, unless its reader goroutines take over:
// a Send that finds its socket full hands reading to every link's reader. The
// spin (and with it the readers' pause) is ten minutes, so that a reader left
// paused would hold the cycle past the test's deadline.
func TestSendCycleOverTCP(t *testing.T) {
	const n = 3
	const size = 48 << 20 // more than the kernel buffers of one connection
	tuning := collective.DefaultTuning()
	tuning.Spin = 10 * time.Minute
	comms, _ := collectivetest.Comms(t, n, collectivetest.Config{Transport: collectivetest.TCP, Tuning: &tuning})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := collectivetest.Each(ctx, comms, func(ctx context.Context, c *collective.Comm) error {
		r := c.Rank()
		from := (r + n - 1) % n
		// A token twice around the same ring first. In the second lap
		// every rank waits in Recv before the token comes, so its call
		// reads the link the big message will come on, which pauses that
		// link's reader.
		token := []int64{0}
		for lap := range 2 {
			if r != 0 {
				if err := collective.Recv(ctx, c, token, from, 4); err != nil {
					return fmt.Errorf("lap %d: recv: %w", lap, err)
				}
			}
			if err := collective.Send(ctx, c, token, (r+1)%n, 4); err != nil {
				return fmt.Errorf("lap %d: send: %w", lap, err)
			}
			if r == 0 {
				if err := collective.Recv(ctx, c, token, from, 4); err != nil {
					return fmt.Errorf("lap %d: recv: %w", lap, err)
				}
			}
		}
		out := make([]byte, size)
		for i := range out {
			out[i] = byte(r*7 + i)
		}
		if err := collective.Send(ctx, c, out, (r+1)%n, 5); err != nil {
			return fmt.Errorf("send: %w", err)
		}
		in := make([]byte, size)
		if err := collective.Recv(ctx, c, in, from, 5); err != nil {
			return fmt.Errorf("recv: %w", err)
		}
		for i, b := range in {
			if want := byte(from*7 + i); b != want {
				return fmt.Errorf("byte %d from rank %d is %d, want %d", i, from, b, want)
			}
		}
		return nil
	})
	if errs != nil {
		t.Fatal(errs)
	}
}
