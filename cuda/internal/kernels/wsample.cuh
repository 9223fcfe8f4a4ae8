// Weighted sampling with replacement: for each uniform draw u in [0, 1), pick the
// index i whose interval of the cumulative weights holds u*total.
//
// The sums are float64 and their order of evaluation is fixed by this file (not by
// the scheduling of the GPU), so a run is deterministic and the CPU twin in Go
// (cuda.WeightedSampleCPU) reproduces it bit for bit. The prefix sum is
// hierarchical, which reads the weights once:
//
//   1. gear_ws_tiles: the weights are cut into tiles of GEAR_WS_TILE elements and
//      each tile's sum A[t] is reduced by one block in a fixed tree.
//   2. gear_ws_scan: one block scans the tile sums into P[0..nt] (P[0] = 0) with
//      a three-phase block scan (per-thread chunks, warp scans, scan of the warp
//      totals). Rounding can make two such sums disagree in the last bit, so P
//      is then made monotone with a masked max-scan (exact in any order):
//      P[t+1] = max(P[t], P_raw[t+1]) when A[t] > 0, and P[t] when A[t] == 0.
//      A tile whose weights are all zero then has an empty interval and is never
//      chosen.
//   3. gear_ws_draws: one warp per draw binary-searches P for the tile, then the
//      32 lanes scan the tile's 32 chunks of 256 elements the same way (sums,
//      warp scan, masked max-scan), and the chosen lane walks its chunk.
//
// An index with weight zero is never returned. Status bits (common.cuh) report
// bad weights, a zero or infinite total and bad draws.

#ifndef GEAR_WSAMPLE_CUH
#define GEAR_WSAMPLE_CUH

#include "common.cuh"

#define GEAR_WS_THREADS 256      // threads of a tile block
#define GEAR_WS_TILE 8192        // elements of a tile
#define GEAR_WS_SCAN_THREADS 1024
#define GEAR_WS_LANE_CHUNK 256   // elements of a lane's chunk in gear_ws_draws

template <typename W>
struct gear_vec;
template <>
struct gear_vec<float> {
  enum { N = 4 };
  static __device__ __forceinline__ void load(const float* p, float* x) {
    const float4 v = *(const float4*)p;
    x[0] = v.x;
    x[1] = v.y;
    x[2] = v.z;
    x[3] = v.w;
  }
};
template <>
struct gear_vec<double> {
  enum { N = 2 };
  static __device__ __forceinline__ void load(const double* p, double* x) {
    const double2 v = *(const double2*)p;
    x[0] = v.x;
    x[1] = v.y;
  }
};

// Phase 1. Thread j of tile t sums, in this order, the elements
//   t*TILE + (m*256 + j)*VEC + q   for m = 0..UNITS-1, q = 0..VEC-1,
// starting from 0.0; then each warp reduces its 32 partial sums with
// x[k] += x[k+off] for off = 16, 8, 4, 2, 1, and warp 0 reduces the 8 warp sums
// the same way with off = 4, 2, 1.
template <typename W>
__device__ __forceinline__ void gear_ws_tiles(const W* __restrict__ w, gear_u64 n,
                                              double* __restrict__ tile_sums,
                                              int* __restrict__ status) {
  const int VEC = gear_vec<W>::N;
  const int UNITS = GEAR_WS_TILE / (GEAR_WS_THREADS * VEC);
  __shared__ double warp_sums[GEAR_WS_THREADS / 32];
  const gear_u64 tile = blockIdx.x;
  const gear_u64 start = tile * GEAR_WS_TILE;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const bool full = start + GEAR_WS_TILE <= n && (((gear_u64)w) & 15) == 0;
  const double wmax = gear_limits<W>::max_finite();
  double acc = 0.0;
  int bad = 0;
  for (int m = 0; m < UNITS; m++) {
    const gear_u64 e0 = start + ((gear_u64)m * GEAR_WS_THREADS + threadIdx.x) * VEC;
    W x[VEC];
    if (full) {
      gear_vec<W>::load(w + e0, x);
    } else {
      for (int q = 0; q < VEC; q++) {
        x[q] = e0 + q < n ? w[e0 + q] : (W)0;
      }
    }
    for (int q = 0; q < VEC; q++) {
      const double d = (double)x[q];
      if (!(d >= 0.0 && d <= wmax)) {
        bad = 1;
      }
      acc = acc + d;
    }
  }
  if (bad) {
    atomicOr(status, GEAR_STATUS_BAD_WEIGHT);
  }
  for (int off = 16; off > 0; off >>= 1) {
    const double o = __shfl_down_sync(GEAR_FULL_MASK, acc, off);
    acc = acc + o;
  }
  if (lane == 0) {
    warp_sums[warp] = acc;
  }
  __syncthreads();
  if (warp == 0) {
    double v = lane < GEAR_WS_THREADS / 32 ? warp_sums[lane] : 0.0;
    for (int off = GEAR_WS_THREADS / 64; off > 0; off >>= 1) {
      const double o = __shfl_down_sync(GEAR_FULL_MASK, v, off);
      v = v + o;
    }
    if (lane == 0) {
      tile_sums[tile] = v;
    }
  }
}

extern "C" __global__ void __launch_bounds__(GEAR_WS_THREADS)
    gear_ws_tiles_f32(const float* w, gear_u64 n, double* tile_sums, int* status) {
  gear_ws_tiles<float>(w, n, tile_sums, status);
}
extern "C" __global__ void __launch_bounds__(GEAR_WS_THREADS)
    gear_ws_tiles_f64(const double* w, gear_u64 n, double* tile_sums, int* status) {
  gear_ws_tiles<double>(w, n, tile_sums, status);
}

// Inclusive warp scan, Kogge-Stone: for d = 1, 2, 4, 8, 16, lanes >= d add the
// value of lane - d (as it was before this step).
__device__ __forceinline__ double gear_warp_sum_scan(double x, int lane) {
  for (int d = 1; d < 32; d <<= 1) {
    const double y = __shfl_up_sync(GEAR_FULL_MASK, x, d);
    if (lane >= d) {
      x = y + x;
    }
  }
  return x;
}

// Inclusive warp max-scan (exact in any order).
__device__ __forceinline__ double gear_warp_max_scan(double x, int lane) {
  for (int d = 1; d < 32; d <<= 1) {
    const double y = __shfl_up_sync(GEAR_FULL_MASK, x, d);
    if (lane >= d) {
      x = fmax(y, x);
    }
  }
  return x;
}

// Phase 2, one block of 1024 threads. Thread j owns tiles [lo, hi) with
// chunk = ceil(nt/1024), lo = min(j*chunk, nt), hi = min(lo+chunk, nt).
//   c_j  = sum of A[lo..hi) from 0.0, in order;
//   x_j  = inclusive warp scan of c (gear_warp_sum_scan);
//   WT   = inclusive warp scan over the 32 warp totals (x of lane 31);
//   X_j  = x_j for warp 0, WT[w-1] + x_j otherwise;
//   E_j  = (w > 0 ? WT[w-1] : 0) for lane 0, X_{j-1} otherwise;
//   P_raw[t+1] = running sum from E_j over A[lo..t], in order.
// Then the masked max-scan described at the top of this file.
extern "C" __global__ void __launch_bounds__(GEAR_WS_SCAN_THREADS)
    gear_ws_scan(const double* __restrict__ a, gear_u64 nt, double* __restrict__ p,
                 int* __restrict__ status) {
  __shared__ double wt[32];
  __shared__ double wm[32];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const gear_u64 chunk = (nt + GEAR_WS_SCAN_THREADS - 1) / GEAR_WS_SCAN_THREADS;
  gear_u64 lo = (gear_u64)tid * chunk;
  if (lo > nt) {
    lo = nt;
  }
  gear_u64 hi = lo + chunk;
  if (hi > nt) {
    hi = nt;
  }
  double c = 0.0;
  for (gear_u64 t = lo; t < hi; t++) {
    c = c + a[t];
  }
  const double x = gear_warp_sum_scan(c, lane);
  if (lane == 31) {
    wt[warp] = x;
  }
  __syncthreads();
  if (warp == 0) {
    wt[lane] = gear_warp_sum_scan(wt[lane], lane);
  }
  __syncthreads();
  const double wex = warp > 0 ? wt[warp - 1] : 0.0;
  const double X = warp > 0 ? wex + x : x;
  const double prev = __shfl_up_sync(GEAR_FULL_MASK, X, 1);
  double run = lane == 0 ? wex : prev;
  for (gear_u64 t = lo; t < hi; t++) {
    run = run + a[t];
    p[t + 1] = run;
  }
  double m = 0.0;
  for (gear_u64 t = lo; t < hi; t++) {
    if (a[t] > 0.0) {
      m = fmax(m, p[t + 1]);
    }
  }
  const double mx = gear_warp_max_scan(m, lane);
  if (lane == 31) {
    wm[warp] = mx;
  }
  __syncthreads();
  if (warp == 0) {
    wm[lane] = gear_warp_max_scan(wm[lane], lane);
  }
  __syncthreads();
  const double wmex = warp > 0 ? wm[warp - 1] : 0.0;
  const double incl = fmax(wmex, mx);
  const double before = __shfl_up_sync(GEAR_FULL_MASK, incl, 1);
  double run_m = lane == 0 ? wmex : before;
  for (gear_u64 t = lo; t < hi; t++) {
    if (a[t] > 0.0) {
      run_m = fmax(run_m, p[t + 1]);
    }
    p[t + 1] = run_m;
  }
  if (tid == 0) {
    p[0] = 0.0;
  }
  __syncthreads();
  if (tid == 0) {
    const double total = p[nt];
    if (total == 0.0) {
      atomicOr(status, GEAR_STATUS_ZERO_TOTAL);
    } else if (!(total <= GEAR_DBL_MAX)) {
      atomicOr(status, GEAR_STATUS_BAD_TOTAL);
    }
  }
}

// Phase 3, one warp per draw. See the top of the file; lane l of the chosen tile
// t owns the elements [t*TILE + l*256, +256) (clipped to n), sums them from 0.0 in
// order (c_l), and the lanes build X~ from c as gear_ws_scan does for threads:
// X = gear_warp_sum_scan(c), X~ = gear_warp_max_scan(c > 0 ? X : 0), base_l =
// X~_{l-1} (0 for lane 0). The chosen lane is the first with X~ > r, or else the
// last with c > 0; it walks its chunk from base adding each positive weight, and
// returns the first element where the running sum exceeds r, or else its last
// positive element.
template <typename W>
__device__ __forceinline__ void gear_ws_draws(const W* __restrict__ w, gear_u64 n,
                                              const double* __restrict__ p, gear_u64 nt,
                                              const double* __restrict__ draws, gear_u64 nd,
                                              gear_i64* __restrict__ out,
                                              int* __restrict__ status) {
  const int lane = threadIdx.x & 31;
  const gear_u64 d = (gear_u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (d >= nd) {
    return;  // the whole warp leaves together
  }
  const double total = p[nt];
  if (!(total > 0.0 && total <= GEAR_DBL_MAX)) {
    if (lane == 0) {
      out[d] = -1;
    }
    return;
  }
  const double u = draws[d];
  if (!(u >= 0.0 && u < 1.0)) {
    if (lane == 0) {
      out[d] = -1;
      atomicOr(status, GEAR_STATUS_BAD_DRAW);
    }
    return;
  }
  const double target = __dmul_rn(u, total);  // never fused with the subtraction below
  gear_u64 lo = 0, hi = nt;
  while (lo < hi) {
    const gear_u64 mid = lo + (hi - lo) / 2;
    if (p[mid + 1] > target) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  if (lo == nt) {
    lo = 0;
    hi = nt;
    while (lo < hi) {
      const gear_u64 mid = lo + (hi - lo) / 2;
      if (p[mid + 1] >= total) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
  }
  const gear_u64 t = lo;
  const double r = target - p[t];
  gear_u64 cs = t * GEAR_WS_TILE + (gear_u64)lane * GEAR_WS_LANE_CHUNK;
  if (cs > n) {
    cs = n;
  }
  gear_u64 ce = cs + GEAR_WS_LANE_CHUNK;
  if (ce > n) {
    ce = n;
  }
  double c = 0.0;
  for (gear_u64 e = cs; e < ce; e++) {
    c = c + (double)w[e];
  }
  const double X = gear_warp_sum_scan(c, lane);
  const double Xm = gear_warp_max_scan(c > 0.0 ? X : 0.0, lane);
  double base = __shfl_up_sync(GEAR_FULL_MASK, Xm, 1);
  if (lane == 0) {
    base = 0.0;
  }
  const unsigned above = __ballot_sync(GEAR_FULL_MASK, Xm > r);
  const unsigned positive = __ballot_sync(GEAR_FULL_MASK, c > 0.0);
  int chosen;
  if (above != 0) {
    chosen = __ffs(above) - 1;
  } else if (positive != 0) {
    chosen = 31 - __clz(positive);
  } else {
    if (lane == 0) {
      out[d] = -1;
      atomicOr(status, GEAR_STATUS_INTERNAL);
    }
    return;
  }
  if (lane == chosen) {
    double run = base;
    gear_i64 pick = -1, last = -1;
    for (gear_u64 e = cs; e < ce; e++) {
      const double x = (double)w[e];
      if (x > 0.0) {
        last = (gear_i64)e;
        run = run + x;
        if (run > r) {
          pick = (gear_i64)e;
          break;
        }
      }
    }
    out[d] = pick >= 0 ? pick : last;
  }
}

extern "C" __global__ void __launch_bounds__(256)
    gear_ws_draws_f32(const float* w, gear_u64 n, const double* p, gear_u64 nt,
                      const double* draws, gear_u64 nd, gear_i64* out, int* status) {
  gear_ws_draws<float>(w, n, p, nt, draws, nd, out, status);
}
extern "C" __global__ void __launch_bounds__(256)
    gear_ws_draws_f64(const double* w, gear_u64 n, const double* p, gear_u64 nt,
                      const double* draws, gear_u64 nd, gear_i64* out, int* status) {
  gear_ws_draws<double>(w, n, p, nt, draws, nd, out, status);
}

#endif
