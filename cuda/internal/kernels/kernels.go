// Package kernels holds gear's CUDA C kernels, the PTX compiled from them, and the
// SHA-256 sums that tie the two together. Regenerate gear.ptx and SHA256SUMS with
// `make ptx` after editing a .cu or .cuh file.
package kernels

import "embed"

// PTX is gear.ptx: every kernel, compiled for compute_80.
//
//go:embed gear.ptx
var PTX string

// Sums is SHA256SUMS: the sha256sum lines of the sources and of gear.ptx as
// `make ptx` wrote them.
//
//go:embed SHA256SUMS
var Sums string

// Compiler is NVCC_VERSION: the release line of `nvcc --version` of the
// compiler that made gear.ptx, as `make ptx` wrote it. Other releases of nvcc
// make other PTX from the same sources.
//
//go:embed NVCC_VERSION
var Compiler string

// Sources holds the CUDA C sources (gear.cu and the headers it includes).
//
//go:embed *.cu *.cuh
var Sources embed.FS

// Main is the source file that nvcc compiles.
const Main = "gear.cu"
