// Top-k by priority: the k indices with the largest priorities, ties broken by the
// smaller index. The order is exact: a priority's bits are mapped to an unsigned
// key that sorts as the float does (negative values flipped, positive ones with
// the sign bit set; so -0 < +0 and a positive NaN sorts above +Inf), and an index
// e is ranked by 0xffffffff - e, so (key, ranked index) is unique.
//
// The k-th largest pair is found by radix select, 8 bits a pass, most significant
// first: first over the key (4 passes for float, 8 for double), then, only if
// the key does not settle it, over the ranked index (4 passes). Each pass is a
// histogram of the elements that match the prefix decided so far
// (gear_topk_hist_*), then one thread picks the digit that holds the k-th
// element (gear_topk_select). The state lives in device memory, so the host
// enqueues every pass without reading anything back. gear_topk_collect_* then
// writes the k selected (key, index) pairs in no particular order; the host
// sorts them.
//
// State (gear_u64 st[8]): 0 key prefix, 1 key mask, 2 index prefix, 3 index mask,
// 4 elements still to take among those matching the prefix, 5 done (1) or
// failed (2), 6 collect counter. hist is 256 gear_u32 counters.

#ifndef GEAR_TOPK_CUH
#define GEAR_TOPK_CUH

#include "common.cuh"

#define GEAR_TOPK_THREADS 256

__device__ __forceinline__ gear_u64 gear_topk_key(float v) {
  unsigned int b = __float_as_uint(v);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (gear_u64)b;
}
__device__ __forceinline__ gear_u64 gear_topk_key(double v) {
  gear_u64 b = (gear_u64)__double_as_longlong(v);
  b = (b & 0x8000000000000000ull) ? ~b : (b | 0x8000000000000000ull);
  return b;
}

extern "C" __global__ void gear_topk_init(gear_u64* st, gear_u32* hist, gear_u64 k) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    hist[i] = 0;
  }
  if (threadIdx.x < 8) {
    st[threadIdx.x] = threadIdx.x == 4 ? k : 0;
  }
}

template <typename W>
__device__ __forceinline__ void gear_topk_hist(const W* __restrict__ w, gear_u64 n, int shift,
                                               int stage, const gear_u64* __restrict__ st,
                                               gear_u32* __restrict__ hist) {
  __shared__ gear_u32 sh[256];
  if (st[5] != 0) {
    return;  // the whole block leaves together
  }
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    sh[i] = 0;
  }
  __syncthreads();
  const gear_u64 kp = st[0], km = st[1], ip = st[2], im = st[3];
  const int lane = threadIdx.x & 31;
  const gear_u64 stride = (gear_u64)gridDim.x * blockDim.x;
  for (gear_u64 base = (gear_u64)blockIdx.x * blockDim.x + (threadIdx.x & ~31u); base < n;
       base += stride) {
    const gear_u64 e = base + lane;
    unsigned int digit = 0xffffffffu;
    if (e < n) {
      const gear_u64 key = gear_topk_key(w[e]);
      if ((key & km) == kp) {
        if (stage == 0) {
          digit = (unsigned int)(key >> shift) & 255u;
        } else {
          const gear_u64 ranked = 0xffffffffull - e;
          if ((ranked & im) == ip) {
            digit = (unsigned int)(ranked >> shift) & 255u;
          }
        }
      }
    }
    const unsigned int peers = __match_any_sync(GEAR_FULL_MASK, digit);
    if (digit != 0xffffffffu && lane == __ffs(peers) - 1) {
      atomicAdd(&sh[digit], (gear_u32)__popc(peers));
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    if (sh[i] != 0) {
      atomicAdd(&hist[i], sh[i]);
    }
  }
}

extern "C" __global__ void __launch_bounds__(GEAR_TOPK_THREADS)
    gear_topk_hist_f32(const float* w, gear_u64 n, int shift, int stage, const gear_u64* st,
                       gear_u32* hist) {
  gear_topk_hist<float>(w, n, shift, stage, st, hist);
}
extern "C" __global__ void __launch_bounds__(GEAR_TOPK_THREADS)
    gear_topk_hist_f64(const double* w, gear_u64 n, int shift, int stage, const gear_u64* st,
                       gear_u32* hist) {
  gear_topk_hist<double>(w, n, shift, stage, st, hist);
}

// One thread: walk the digits from 255 down to the one that holds the k-th
// element, narrow the prefix to it, and clear the histogram for the next pass.
extern "C" __global__ void gear_topk_select(int shift, int stage, gear_u64* st, gear_u32* hist) {
  if (threadIdx.x != 0 || blockIdx.x != 0) {
    return;
  }
  if (st[5] == 0) {
    const gear_u64 k = st[4];
    gear_u64 cum = 0;
    int d = 255;
    for (; d >= 0; d--) {
      const gear_u64 h = hist[d];
      if (cum + h >= k) {
        break;
      }
      cum += h;
    }
    if (d < 0 || k == 0) {
      st[5] = 2;
    } else {
      const gear_u64 left = k - cum;
      if (stage == 0) {
        st[0] |= (gear_u64)d << shift;
        st[1] |= 255ull << shift;
      } else {
        st[2] |= (gear_u64)d << shift;
        st[3] |= 255ull << shift;
      }
      st[4] = left;
      if ((gear_u64)hist[d] == left) {
        st[5] = 1;
      }
    }
  }
  for (int i = 0; i < 256; i++) {
    hist[i] = 0;
  }
}

template <typename W>
__device__ __forceinline__ void gear_topk_collect(const W* __restrict__ w, gear_u64 n,
                                                  gear_u64* __restrict__ st, gear_u64 k,
                                                  gear_u64* __restrict__ keys,
                                                  gear_i64* __restrict__ idx) {
  const gear_u64 kp = st[0], km = st[1], ip = st[2], im = st[3];
  const gear_u64 stride = (gear_u64)gridDim.x * blockDim.x;
  for (gear_u64 e = (gear_u64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
    const gear_u64 key = gear_topk_key(w[e]);
    const gear_u64 kt = key & km;
    bool sel = kt > kp;
    if (!sel && kt == kp) {
      sel = im == 0 || ((0xffffffffull - e) & im) >= ip;
    }
    if (sel) {
      const gear_u64 slot = atomicAdd((unsigned long long*)&st[6], 1ull);
      if (slot < k) {
        keys[slot] = key;
        idx[slot] = (gear_i64)e;
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(GEAR_TOPK_THREADS)
    gear_topk_collect_f32(const float* w, gear_u64 n, gear_u64* st, gear_u64 k, gear_u64* keys,
                          gear_i64* idx) {
  gear_topk_collect<float>(w, n, st, k, keys, idx);
}
extern "C" __global__ void __launch_bounds__(GEAR_TOPK_THREADS)
    gear_topk_collect_f64(const double* w, gear_u64 n, gear_u64* st, gear_u64 k, gear_u64* keys,
                          gear_i64* idx) {
  gear_topk_collect<double>(w, n, st, k, keys, idx);
}

#endif
