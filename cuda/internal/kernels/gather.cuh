// Zero-copy gather: copy the selected blocks of a column table (usually host memory
// registered with the driver and read through its device pointer) into one
// contiguous device buffer, one output row per selected index, through a window.
//
// Row r of dst is row_bytes long: head_bytes of zeros, then copy_bytes read from
// src + indices[r]*block_bytes + off_r (off_r is offsets[r] when offsets is not
// null, else src_off), then zeros up to row_bytes.
//
// The host picks the widest element V (16, 4 or 1 bytes) that divides every
// pointer, stride and length, so that the common case (16-byte aligned blocks)
// moves 16 bytes per load. Each thread keeps GEAR_GATHER_UNROLL independent loads
// in flight, and the grid covers rows (y) and the units of a row (x), so that
// many PCIe reads are outstanding at once: that is what saturates the link.

#ifndef GEAR_GATHER_CUH
#define GEAR_GATHER_CUH

#include "common.cuh"

#define GEAR_GATHER_UNROLL 4

template <typename V>
__device__ __forceinline__ V gear_zero();
template <>
__device__ __forceinline__ uint4 gear_zero<uint4>() {
  return make_uint4(0u, 0u, 0u, 0u);
}
template <>
__device__ __forceinline__ unsigned int gear_zero<unsigned int>() {
  return 0u;
}
template <>
__device__ __forceinline__ unsigned char gear_zero<unsigned char>() {
  return 0;
}

// gear_gather_rows<N> is the block indices of a gather launched with them in
// its parameters (gear_gather_rows_v*: N = GEAR_GATHER_PARAM_ROWS, and
// gear_gather_rows256_v*: N = 256): a launch then needs no copy of them to the
// device first. Kernel parameters hold 4 KiB in all; the host launches more
// rows as several launches, and takes the smaller form where the rows fit it,
// so that a small launch carries no more than it needs.
#define GEAR_GATHER_PARAM_ROWS 960
template <int N>
struct gear_gather_rows {
  gear_u32 idx[N];
};

// The two sources of a row's block index: an int64 array in device memory, or
// the launch's parameters (read in place: the kernels take them as
// __grid_constant__).
struct gear_index_array {
  const gear_i64* __restrict__ p;
  __device__ __forceinline__ gear_u64 operator()(gear_u64 row) const { return (gear_u64)p[row]; }
};
template <int N>
struct gear_index_param {
  const gear_gather_rows<N>* p;
  __device__ __forceinline__ gear_u64 operator()(gear_u64 row) const { return (gear_u64)p->idx[row]; }
};

template <typename V, typename Index>
__device__ __forceinline__ void gear_gather(unsigned char* __restrict__ dst,
                                            const unsigned char* __restrict__ src,
                                            Index index,
                                            const gear_i64* __restrict__ offsets,
                                            gear_u64 n_rows, gear_u64 block_bytes,
                                            gear_u64 src_off, gear_u64 head_bytes,
                                            gear_u64 copy_bytes, gear_u64 row_bytes) {
  const gear_u64 vb = sizeof(V);
  const gear_u64 row_units = row_bytes / vb;
  const gear_u64 head = head_bytes / vb;
  const gear_u64 copy = copy_bytes / vb;
  const gear_u64 bdim = blockDim.x;
  const gear_u64 step = (gear_u64)gridDim.x * bdim * GEAR_GATHER_UNROLL;
  const gear_u64 first = (gear_u64)blockIdx.x * bdim * GEAR_GATHER_UNROLL + threadIdx.x;
  for (gear_u64 row = blockIdx.y; row < n_rows; row += gridDim.y) {
    const gear_u64 off = offsets ? (gear_u64)offsets[row] : src_off;
    const V* s = (const V*)(src + index(row) * block_bytes + off);
    V* d = (V*)(dst + row * row_bytes);
    for (gear_u64 base = first; base < row_units; base += step) {
      V v[GEAR_GATHER_UNROLL];
#pragma unroll
      for (int j = 0; j < GEAR_GATHER_UNROLL; j++) {
        const gear_u64 u = base + (gear_u64)j * bdim;
        v[j] = gear_zero<V>();
        if (u < row_units && u >= head && u - head < copy) {
          v[j] = s[u - head];
        }
      }
#pragma unroll
      for (int j = 0; j < GEAR_GATHER_UNROLL; j++) {
        const gear_u64 u = base + (gear_u64)j * bdim;
        if (u < row_units) {
          d[u] = v[j];
        }
      }
    }
  }
}

#define GEAR_GATHER_PARAMS                                                       \
  unsigned char *dst, const unsigned char *src, const gear_i64 *indices,         \
      const gear_i64 *offsets, gear_u64 n_rows, gear_u64 block_bytes,            \
      gear_u64 src_off, gear_u64 head_bytes, gear_u64 copy_bytes, gear_u64 row_bytes
#define GEAR_GATHER_ARGS \
  dst, src, gear_index_array{indices}, offsets, n_rows, block_bytes, src_off, head_bytes, copy_bytes, row_bytes
#define GEAR_GATHER_ROWS_PARAMS(N)                                                   \
  unsigned char *dst, const unsigned char *src, gear_u64 n_rows, gear_u64 block_bytes, \
      gear_u64 src_off, gear_u64 head_bytes, gear_u64 copy_bytes, gear_u64 row_bytes,  \
      const __grid_constant__ gear_gather_rows<N> rows
#define GEAR_GATHER_ROWS_ARGS(N)                                                           \
  dst, src, gear_index_param<N>{&rows}, (const gear_i64*)0, n_rows, block_bytes, src_off,   \
      head_bytes, copy_bytes, row_bytes

extern "C" __global__ void __launch_bounds__(256) gear_gather_v16(GEAR_GATHER_PARAMS) {
  gear_gather<uint4>(GEAR_GATHER_ARGS);
}
extern "C" __global__ void __launch_bounds__(256) gear_gather_v4(GEAR_GATHER_PARAMS) {
  gear_gather<unsigned int>(GEAR_GATHER_ARGS);
}
extern "C" __global__ void __launch_bounds__(256) gear_gather_v1(GEAR_GATHER_PARAMS) {
  gear_gather<unsigned char>(GEAR_GATHER_ARGS);
}

#define GEAR_GATHER_ROWS_KERNEL(name, V, N)                                             \
  extern "C" __global__ void __launch_bounds__(256) name(GEAR_GATHER_ROWS_PARAMS(N)) { \
    gear_gather<V>(GEAR_GATHER_ROWS_ARGS(N));                                          \
  }
GEAR_GATHER_ROWS_KERNEL(gear_gather_rows_v16, uint4, GEAR_GATHER_PARAM_ROWS)
GEAR_GATHER_ROWS_KERNEL(gear_gather_rows_v4, unsigned int, GEAR_GATHER_PARAM_ROWS)
GEAR_GATHER_ROWS_KERNEL(gear_gather_rows_v1, unsigned char, GEAR_GATHER_PARAM_ROWS)
GEAR_GATHER_ROWS_KERNEL(gear_gather_rows256_v16, uint4, 256)
GEAR_GATHER_ROWS_KERNEL(gear_gather_rows256_v4, unsigned int, 256)
GEAR_GATHER_ROWS_KERNEL(gear_gather_rows256_v1, unsigned char, 256)

#endif
