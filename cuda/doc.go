// Package cuda binds the CUDA driver and NCCL at run time (dlopen), embeds the PTX
// kernels of collection and selection, and holds their CPU reference twins.
package cuda
