package cuda

// HideCopyBatch makes dev's driver look like one before CUDA 12.8, without
// cuMemcpyBatchAsync, until the returned function puts it back.
func HideCopyBatch(dev *Device) (restore func()) {
	fn := dev.drv.fn.cuMemcpyBatchAsync
	dev.drv.fn.cuMemcpyBatchAsync = 0
	return func() { dev.drv.fn.cuMemcpyBatchAsync = fn }
}

// SetGatherSmallRows sets the most rows LaunchGatherHost gives the kernel's
// 256-row form (0: none), until the returned function puts it back.
func SetGatherSmallRows(n int) (restore func()) {
	old := gatherSmallRows
	gatherSmallRows = n
	return func() { gatherSmallRows = old }
}
