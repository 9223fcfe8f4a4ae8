//go:build !cgo

package gmi

import (
	"context"
	"errors"
)

// Without cgo there is no NVML binding: such a binary sees no GPUs, and a
// topology file (GEAR_TOPOLOGY) is the only way to describe them.
func readNVML(ctx context.Context, cfg *discoverConfig) (*Topology, error) {
	return &Topology{Source: SourceNone, Reason: "built without cgo: NVML is not available", GPUs: []GPU{}}, nil
}

// OpenMemorySampler fails without cgo: there is no NVML to read memory from.
func OpenMemorySampler() (MemorySampler, error) {
	return nil, errors.New("gmi: built without cgo: NVML is not available to read memory")
}
