// Package gmitest helps tests of gmi and of the packages that use it.
//
// NewDGXA100 returns go-nvml's own mock of a DGX A100 server
// (pkg/nvml/mock/dgxa100): eight A100-SXM4-40GB GPUs with NVIDIA's MIG
// profiles and placements behind the real nvml.Interface. EnableMIG and
// CreateInstance make MIG GPU and compute instances through the mock's own
// calls. The mock does not answer the MIG device handle queries that carry
// MIG UUIDs (GetMaxMigDeviceCount, GetMigDeviceHandleByIndex); NewDGXA100
// adds them, derived from the mock's instances, so that discovery code runs
// unchanged against it.
//
// The helpers need cgo, as go-nvml does.
package gmitest
