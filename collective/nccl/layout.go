package nccl

import (
	"context"
	"errors"
	"slices"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/cuda"
)

// LayoutDevice is a CUDA device as a collective.Layout uses it
// (collective.WithDevice): host copies of device buffers through the driver,
// and NCCL communicators for the layout's "nccl" groups. Build it with
// ForLayout.
type LayoutDevice struct {
	dev  *cuda.Device
	opts []Option
}

var (
	_ collective.Device      = (*LayoutDevice)(nil)
	_ collective.DeviceLinks = (*LayoutDevice)(nil)
	_ collective.DeviceGroup = layoutGroup{}
)

// ForLayout is dev for collective.WithDevice: the layout's "nccl" groups get
// NCCL communicators (FromComm on each group's sub-communicator, named
// "layout") built with opts (the library, the stream) when NCCL loads on every
// rank; otherwise every step takes the host path through host copies.
//
//	l, err := collective.NewLayout(ctx, c, m, collective.WithDevice(nccl.ForLayout(dev)))
//	err = l.AllReduceDevice(ctx, collective.DevicePtr(p), n, collective.Float32, collective.Sum)
func ForLayout(dev *cuda.Device, opts ...Option) *LayoutDevice {
	return &LayoutDevice{dev: dev, opts: slices.Clone(opts)}
}

var errNoDevice = errors.New("collective: layout: nil device")

// CopyToHost copies len(dst) bytes of device memory at src into dst.
func (d *LayoutDevice) CopyToHost(dst []byte, src collective.DevicePtr) error {
	if d == nil || d.dev == nil {
		return errNoDevice
	}
	return d.dev.CopyDtoH(dst, cuda.DevicePtr(src))
}

// CopyToDevice copies src into device memory at dst.
func (d *LayoutDevice) CopyToDevice(dst collective.DevicePtr, src []byte) error {
	if d == nil || d.dev == nil {
		return errNoDevice
	}
	return d.dev.CopyHtoD(cuda.DevicePtr(dst), src)
}

// LinksAvailable reports whether NCCL loads (or was given, WithLibrary).
func (d *LayoutDevice) LinksAvailable() bool {
	if d == nil || d.dev == nil {
		return false
	}
	var cfg config
	for _, o := range d.opts {
		o(&cfg)
	}
	if cfg.lib != nil {
		return true
	}
	_, err := cuda.OpenNCCL()
	return err == nil
}

// NewDeviceGroup builds the NCCL communicator of the ranks of c, a
// sub-communicator of the layout.
func (d *LayoutDevice) NewDeviceGroup(ctx context.Context, c *collective.Comm) (collective.DeviceGroup, error) {
	if d == nil || d.dev == nil {
		return nil, errNoDevice
	}
	n, err := FromComm(ctx, c, d.dev, append(slices.Clone(d.opts), WithName("layout"))...)
	if err != nil {
		return nil, err
	}
	return layoutGroup{n}, nil
}

// layoutGroup runs a layout's steps in place on an NCCL communicator.
type layoutGroup struct{ c *Comm }

func (g layoutGroup) AllReduce(ctx context.Context, buf collective.DevicePtr, count int, dt collective.DType, op collective.Op) error {
	p := cuda.DevicePtr(buf)
	return g.c.AllReduce(ctx, p, p, count, dt, op)
}

func (g layoutGroup) Reduce(ctx context.Context, buf collective.DevicePtr, count int, dt collective.DType, op collective.Op, root int) error {
	p := cuda.DevicePtr(buf)
	return g.c.Reduce(ctx, p, p, count, dt, op, root)
}

func (g layoutGroup) Broadcast(ctx context.Context, buf collective.DevicePtr, count int, dt collective.DType, root int) error {
	p := cuda.DevicePtr(buf)
	return g.c.Broadcast(ctx, p, p, count, dt, root)
}

// Fail aborts the NCCL communicator with the layout's cause, without
// publishing it (the layout does).
func (g layoutGroup) Fail(err error) { g.c.fail(err, false) }

func (g layoutGroup) Close() error { return g.c.Close() }
