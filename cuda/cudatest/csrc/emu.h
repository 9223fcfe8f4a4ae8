// emu.h: just enough of CUDA C++ for gear's kernels to compile with a host C++
// compiler and run on the CPU. Each CUDA thread of a block runs as a fiber on the
// calling OS thread; blocks run one after another, so `__shared__` can be a
// function-level static. Block barriers and the warp intrinsics (shuffles,
// ballot, match) switch fibers; a barrier that some live thread never reaches is
// reported as a deadlock instead of hanging. Launches are serialised by the
// caller (fakecuda.cc holds a lock).
#ifndef GEAR_EMU_H
#define GEAR_EMU_H

#include <cmath>
#include <cstdint>
#include <cstring>

struct dim3 {
  unsigned int x, y, z;
};
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) double2 {
  double x, y;
};
static inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) {
  uint4 v = {x, y, z, w};
  return v;
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static
#define __grid_constant__

// The running fiber's coordinates, set by the scheduler before each switch.
extern dim3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;
#define threadIdx emu_threadIdx
#define blockIdx emu_blockIdx
#define blockDim emu_blockDim
#define gridDim emu_gridDim

void emu_syncthreads();
void emu_syncwarp();
// emu_exchange publishes this lane's 8 bytes to its warp and returns the slots of
// all 32 lanes (valid until the lane's next exchange).
const uint64_t* emu_exchange(uint64_t mine);
int emu_lane();
int emu_warp_lanes();  // lanes of the running thread's warp that exist

static inline void __syncthreads() { emu_syncthreads(); }
static inline void __syncwarp(unsigned = 0xffffffffu) { emu_syncwarp(); }
static inline void __threadfence() {}

template <typename T>
static inline uint64_t emu_bits(T v) {
  uint64_t b = 0;
  memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
static inline T emu_from(uint64_t b) {
  T v;
  memcpy(&v, &b, sizeof(T));
  return v;
}
template <typename T>
static inline T __shfl_sync(unsigned, T v, int src, int = 32) {
  const uint64_t* s = emu_exchange(emu_bits(v));
  src &= 31;
  return src < emu_warp_lanes() ? emu_from<T>(s[src]) : v;
}
template <typename T>
static inline T __shfl_up_sync(unsigned, T v, unsigned d, int = 32) {
  const uint64_t* s = emu_exchange(emu_bits(v));
  const int src = emu_lane() - (int)d;
  return src >= 0 ? emu_from<T>(s[src]) : v;
}
template <typename T>
static inline T __shfl_down_sync(unsigned, T v, unsigned d, int = 32) {
  const uint64_t* s = emu_exchange(emu_bits(v));
  const int src = emu_lane() + (int)d;
  return src < emu_warp_lanes() ? emu_from<T>(s[src]) : v;
}
template <typename T>
static inline T __shfl_xor_sync(unsigned, T v, int m, int = 32) {
  const uint64_t* s = emu_exchange(emu_bits(v));
  const int src = emu_lane() ^ m;
  return src < emu_warp_lanes() ? emu_from<T>(s[src]) : v;
}
static inline unsigned __ballot_sync(unsigned, int pred) {
  const uint64_t* s = emu_exchange(pred ? 1 : 0);
  unsigned m = 0;
  for (int l = 0; l < emu_warp_lanes(); l++) {
    if (s[l]) m |= 1u << l;
  }
  return m;
}
template <typename T>
static inline unsigned __match_any_sync(unsigned, T v) {
  const uint64_t mine = emu_bits(v);
  const uint64_t* s = emu_exchange(mine);
  unsigned m = 0;
  for (int l = 0; l < emu_warp_lanes(); l++) {
    if (s[l] == mine) m |= 1u << l;
  }
  return m;
}

static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline unsigned int __float_as_uint(float f) { return emu_from<unsigned int>(emu_bits(f)); }
static inline long long __double_as_longlong(double d) { return (long long)emu_bits(d); }
static inline double __dmul_rn(double a, double b) {
  volatile double r = a * b;  // one rounded multiply, never fused
  return r;
}

// The rounded arithmetic intrinsics: each operation rounded on its own, never
// fused (the library is also built with -ffp-contract=off).
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
static inline float __fsqrt_rn(float a) { volatile float r = sqrtf(a); return r; }
static inline double __dadd_rn(double a, double b) { volatile double r = a + b; return r; }
static inline double __dsub_rn(double a, double b) { volatile double r = a - b; return r; }
// Fibers run one at a time, so plain read-modify-writes are atomic.
template <typename T>
static inline T atomicAdd(T* p, T v) {
  T old = *p;
  *p = old + v;
  return old;
}
static inline int atomicOr(int* p, int v) {
  int old = *p;
  *p = old | v;
  return old;
}

#endif
