package sample

import (
	"context"
	"errors"
	"testing"

	"github.com/gear-rl/gear/cuda/cudatest"
)

// TestRegisterDeviceUnderCtx pins that RegisterDevice pins tables under the
// caller's ctx: a cancelled ctx registers nothing and leaves nothing pinned,
// and a live one then registers every column table.
func TestRegisterDeviceUnderCtx(t *testing.T) {
	f := openFakeGPU(t)
	dev := f.device(t, 0)
	st, _ := shardTable(t, 8, Config{})
	regs := f.cu.Live(cudatest.LiveRegistrations)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := st.RegisterDevice(ctx, dev); !errors.Is(err, context.Canceled) {
		t.Fatalf("RegisterDevice under a cancelled ctx = %v, want context.Canceled", err)
	}
	if got := f.cu.Live(cudatest.LiveRegistrations) - regs; got != 0 {
		t.Fatalf("%d column tables left registered by a cancelled RegisterDevice", got)
	}
	if err := st.RegisterDevice(t.Context(), dev); err != nil {
		t.Fatal(err)
	}
	if got := f.cu.Live(cudatest.LiveRegistrations) - regs; got != len(testColumns) {
		t.Fatalf("%d registrations for %d column tables", got, len(testColumns))
	}
}
