// The learner's kernels: a multilayer perceptron's forward and backward passes,
// Double DQN's TD error with the Huber loss, global-norm gradient clipping and
// Adam, all in float32 parameters with float64 where the CPU learner uses it.
//
// Every sum runs in a fixed order, and every product and sum is rounded on its
// own (__fmul_rn, __fadd_rn: nvcc never fuses them into an FMA), so that the Go
// twins in package cuda compute bit for bit what these kernels compute:
//
//   - gear_mm_f32: C(i,j) = epilogue(sum over t = 0..k-1, in order, of A(i,t)·B(t,j))
//     through 16x16 tiles of shared memory. A and B are read through element
//     strides, so one kernel is the forward pass (X·Wᵀ), the input gradient
//     (G·W) and the weight gradient (Gᵀ·X), and reads observations in place in
//     the rows of a gathered batch. The epilogue adds bias[j], applies ReLU, and
//     zeroes entries where mask (the layer's ReLU output) is not positive.
//   - gear_colsum_f32: out[j] = sum over rows s, in order, of g[s][j] (bias gradients).
//   - gear_dqn_td and gear_dqn_td_sum: the TD error of each item of a batch, the
//     loss gradient with respect to Q, the new priority |δ|+ε, then one thread
//     sums the batch's statistics in item order.
//   - gear_sumsq_f32 and gear_clip_scale: the gradient's squared norm in blocks
//     of 4096 (each a fixed tree), the blocks summed in order by one thread, and
//     the clipping factor.
//   - gear_adam_f32, gear_soft_update_f32: the optimizer step and soft target
//     updates.
//   - gear_prio_scatter: writes priority^alpha of sampled items back into the
//     sampling weights in device memory.

#ifndef GEAR_MLP_CUH
#define GEAR_MLP_CUH

#include "common.cuh"

#define GEAR_MM_TILE 16
#define GEAR_SUMSQ_THREADS 256
#define GEAR_SUMSQ_BLOCK 4096  // elements per block of gear_sumsq_f32

extern "C" __global__ void __launch_bounds__(GEAR_MM_TILE* GEAR_MM_TILE)
    gear_mm_f32(float* __restrict__ c, const float* __restrict__ a, const float* __restrict__ b,
                const float* __restrict__ bias, const float* __restrict__ mask, gear_i64 m,
                gear_i64 n, gear_i64 k, gear_i64 a_i, gear_i64 a_k, gear_i64 b_k, gear_i64 b_j,
                gear_i64 ldc, gear_i64 ldm, int relu) {
  __shared__ float as[GEAR_MM_TILE][GEAR_MM_TILE + 1];
  __shared__ float bs[GEAR_MM_TILE][GEAR_MM_TILE + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const gear_i64 i0 = (gear_i64)blockIdx.y * GEAR_MM_TILE, j0 = (gear_i64)blockIdx.x * GEAR_MM_TILE;
  const gear_i64 i = i0 + ty, j = j0 + tx;
  // Neighbouring threads (tx) load neighbouring addresses: a tile is loaded
  // across its rows when A (or B) is stored by columns. Which thread loads an
  // element changes nothing in the sums.
  const bool a_cols = a_i == 1 && a_k != 1, b_rows = b_k == 1 && b_j != 1;
  float acc = 0.0f;
  for (gear_i64 t0 = 0; t0 < k; t0 += GEAR_MM_TILE) {
    if (a_cols) {
      as[tx][ty] = (i0 + tx < m && t0 + ty < k) ? a[(i0 + tx) * a_i + (t0 + ty) * a_k] : 0.0f;
    } else {
      as[ty][tx] = (i < m && t0 + tx < k) ? a[i * a_i + (t0 + tx) * a_k] : 0.0f;
    }
    if (b_rows) {
      bs[tx][ty] = (t0 + tx < k && j0 + ty < n) ? b[(t0 + tx) * b_k + (j0 + ty) * b_j] : 0.0f;
    } else {
      bs[ty][tx] = (t0 + ty < k && j < n) ? b[(t0 + ty) * b_k + j * b_j] : 0.0f;
    }
    __syncthreads();
    const int lim = (k - t0) < GEAR_MM_TILE ? (int)(k - t0) : GEAR_MM_TILE;
    for (int t = 0; t < lim; t++) {
      acc = __fadd_rn(acc, __fmul_rn(as[ty][t], bs[t][tx]));
    }
    __syncthreads();
  }
  if (i >= m || j >= n) return;
  float v = acc;
  if (bias) v = __fadd_rn(v, bias[j]);
  if (relu && !(v > 0.0f)) v = 0.0f;
  if (mask && !(mask[i * ldm + j] > 0.0f)) v = 0.0f;
  c[i * ldc + j] = v;
}

extern "C" __global__ void __launch_bounds__(256)
    gear_colsum_f32(float* __restrict__ out, const float* __restrict__ g, gear_i64 rows,
                    gear_i64 cols) {
  const gear_i64 j = (gear_i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float acc = 0.0f;
  for (gear_i64 s = 0; s < rows; s++) acc = __fadd_rn(acc, g[s * cols + j]);
  out[j] = acc;
}

// gear_dqn_td: item i of a batch of n. q holds Q_online(s_i) in row i, qn
// Q_online(s'_i) and qt Q_target(s'_i); the action, reward and discount of item
// i are words action_off, reward_off and discount_off of row i of the batch
// (rows of row_words 4-byte words). w is the item's importance weight,
// normalized. Writes dout's row i (the loss gradient with respect to Q, zero
// but at the action), item[4i..4i+3] (weighted loss/n, Q(s,a)/n, |δ|/n, and the
// priority |δ|+eps) and, for a bad action, status bit 1.
extern "C" __global__ void __launch_bounds__(256)
    gear_dqn_td(float* __restrict__ dout, double* __restrict__ item, int* __restrict__ status,
                const float* __restrict__ q, const float* __restrict__ qn,
                const float* __restrict__ qt, const float* __restrict__ rows,
                const double* __restrict__ w, gear_i64 n, gear_i64 na, gear_i64 row_words,
                gear_i64 action_off, gear_i64 reward_off, gear_i64 discount_off, double huber,
                double eps) {
  const gear_i64 i = (gear_i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float* next = qn + i * na;
  gear_i64 best = 0;
  for (gear_i64 x = 1; x < na; x++) {
    if (next[x] > next[best]) best = x;
  }
  const float* row = rows + i * row_words;
  const int a = ((const int*)row)[action_off];
  const double r = (double)row[reward_off];
  const double d = (double)row[discount_off];
  const double y = __dadd_rn(r, __dmul_rn(d, (double)qt[i * na + best]));
  for (gear_i64 x = 0; x < na; x++) dout[i * na + x] = 0.0f;
  if (a < 0 || a >= na) {
    atomicOr(status, 1);
    item[4 * i] = item[4 * i + 1] = item[4 * i + 2] = item[4 * i + 3] = 0.0;
    return;
  }
  const double qa = (double)q[i * na + a];
  const double delta = __dsub_rn(qa, y);
  double loss, g;
  if (delta > huber) {
    loss = __dmul_rn(huber, __dsub_rn(delta, __dmul_rn(0.5, huber)));
    g = huber;
  } else if (delta < -huber) {
    loss = __dmul_rn(huber, __dsub_rn(-delta, __dmul_rn(0.5, huber)));
    g = -huber;
  } else {
    loss = __dmul_rn(__dmul_rn(0.5, delta), delta);
    g = delta;
  }
  const double inv_n = 1.0 / (double)n;
  const double ad = delta < 0 ? -delta : delta;
  dout[i * na + a] = (float)__dmul_rn(__dmul_rn(w[i], g), inv_n);
  item[4 * i] = __dmul_rn(__dmul_rn(w[i], loss), inv_n);
  item[4 * i + 1] = __dmul_rn(qa, inv_n);
  item[4 * i + 2] = __dmul_rn(ad, inv_n);
  item[4 * i + 3] = __dadd_rn(ad, eps);
}

// gear_dqn_td_sum: one thread sums the items' statistics in order into
// stats[0..2] and raises stats[3], the largest priority so far.
extern "C" __global__ void __launch_bounds__(32)
    gear_dqn_td_sum(double* __restrict__ stats, const double* __restrict__ item, gear_i64 n) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double l = 0.0, q = 0.0, t = 0.0, mp = stats[3];
  for (gear_i64 i = 0; i < n; i++) {
    l = __dadd_rn(l, item[4 * i]);
    q = __dadd_rn(q, item[4 * i + 1]);
    t = __dadd_rn(t, item[4 * i + 2]);
    if (item[4 * i + 3] > mp) mp = item[4 * i + 3];
  }
  stats[0] = l;
  stats[1] = q;
  stats[2] = t;
  stats[3] = mp;
}

extern "C" __global__ void __launch_bounds__(GEAR_SUMSQ_THREADS)
    gear_sumsq_f32(double* __restrict__ partial, const float* __restrict__ g, gear_i64 n) {
  __shared__ double s[GEAR_SUMSQ_THREADS];
  const int t = threadIdx.x;
  const gear_i64 base = (gear_i64)blockIdx.x * GEAR_SUMSQ_BLOCK;
  double acc = 0.0;
  for (int r = 0; r < GEAR_SUMSQ_BLOCK / GEAR_SUMSQ_THREADS; r++) {
    const gear_i64 e = base + t + (gear_i64)r * GEAR_SUMSQ_THREADS;
    if (e < n) {
      const double x = (double)g[e];
      acc = __dadd_rn(acc, __dmul_rn(x, x));
    }
  }
  s[t] = acc;
  __syncthreads();
  for (int stride = GEAR_SUMSQ_THREADS / 2; stride > 0; stride >>= 1) {
    if (t < stride) s[t] = __dadd_rn(s[t], s[t + stride]);
    __syncthreads();
  }
  if (t == 0) partial[blockIdx.x] = s[0];
}

// gear_clip_scale: out[0] = the norm (the blocks' sums in order, then the
// square root); scale[0] = max_norm/(norm+1e-6) when max_norm > 0 and the norm
// exceeds it, else 1.
extern "C" __global__ void __launch_bounds__(32)
    gear_clip_scale(double* __restrict__ out, float* __restrict__ scale,
                    const double* __restrict__ partial, gear_i64 blocks, double max_norm) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double ss = 0.0;
  for (gear_i64 b = 0; b < blocks; b++) ss = __dadd_rn(ss, partial[b]);
  const double norm = sqrt(ss);
  out[0] = norm;
  scale[0] = (max_norm > 0 && norm > max_norm) ? (float)(max_norm / __dadd_rn(norm, 1e-6)) : 1.0f;
}

// gear_adam_f32: one Adam step of n parameters from the gradients g times
// scale[0]. c1 and c2 are the bias corrections 1-β1^t and 1-β2^t, omb1 and
// omb2 are 1-β1 and 1-β2, all rounded to float32 by the host.
extern "C" __global__ void __launch_bounds__(256)
    gear_adam_f32(float* __restrict__ p, float* __restrict__ m, float* __restrict__ v,
                  const float* __restrict__ g, const float* __restrict__ scale, gear_i64 n,
                  float b1, float b2, float omb1, float omb2, float lr, float c1, float c2,
                  float eps) {
  const gear_i64 i = (gear_i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float gi = __fmul_rn(g[i], scale[0]);
  const float mi = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(omb1, gi));
  const float vi = __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(__fmul_rn(omb2, gi), gi));
  m[i] = mi;
  v[i] = vi;
  const float den = __fadd_rn(__fsqrt_rn(__fdiv_rn(vi, c2)), eps);
  p[i] = __fsub_rn(p[i], __fdiv_rn(__fmul_rn(lr, __fdiv_rn(mi, c1)), den));
}

extern "C" __global__ void __launch_bounds__(256)
    gear_soft_update_f32(float* __restrict__ tp, const float* __restrict__ p, gear_i64 n,
                         float tau) {
  const gear_i64 i = (gear_i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  tp[i] = __fadd_rn(tp[i], __fmul_rn(tau, __fsub_rn(p[i], tp[i])));
}

// gear_prio_scatter: weights[idx[i]] = prio[4i+3]^alpha (the priorities
// gear_dqn_td wrote) for the n items of a batch. An index drawn twice is the
// same item with the same priority.
extern "C" __global__ void __launch_bounds__(256)
    gear_prio_scatter(float* __restrict__ weights, const gear_i64* __restrict__ idx,
                      const double* __restrict__ item, gear_i64 n, double alpha) {
  const gear_i64 i = (gear_i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  weights[idx[i]] = (float)pow(item[4 * i + 3], alpha);
}

// gear_is_weights: one block computes the normalized importance weights of n
// sampled items: x_i = (size · weights[idx[i]] / total)^−β (1 when β is 0), and
// out[i] = x_i / max_j x_j. total is the float64 sum of the weights (the
// weighted sampler's scan leaves it in device memory).
#define GEAR_IS_THREADS 256
extern "C" __global__ void __launch_bounds__(GEAR_IS_THREADS)
    gear_is_weights(double* __restrict__ out, const float* __restrict__ weights,
                    const gear_i64* __restrict__ idx, gear_i64 n, double size,
                    const double* __restrict__ total, double beta) {
  __shared__ double mx[GEAR_IS_THREADS];
  const int t = threadIdx.x;
  const double tot = total[0];
  double m = 0.0;
  for (gear_i64 i = t; i < n; i += GEAR_IS_THREADS) {
    double x = 1.0;
    if (beta != 0) x = pow(__dmul_rn(size, (double)weights[idx[i]] / tot), -beta);
    out[i] = x;
    if (x > m) m = x;
  }
  mx[t] = m;
  __syncthreads();
  for (int stride = GEAR_IS_THREADS / 2; stride > 0; stride >>= 1) {
    if (t < stride && mx[t + stride] > mx[t]) mx[t] = mx[t + stride];
    __syncthreads();
  }
  const double wmax = mx[0];
  for (gear_i64 i = t; i < n; i += GEAR_IS_THREADS) out[i] = out[i] / wmax;
}

#endif
