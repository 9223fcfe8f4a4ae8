package collective_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

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
