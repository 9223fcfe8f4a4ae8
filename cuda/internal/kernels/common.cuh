// Shared definitions of gear's kernels.
//
// The kernels are written so that the same source compiles two ways: with nvcc
// to PTX (the code the driver runs), and with a host C++ compiler against the
// emulation header of package cudatest, which runs every CUDA thread as a fiber
// so that tests without a GPU execute this exact source. Keep to the subset the
// emulator provides: no inline PTX, no dynamic shared memory, warp intrinsics
// with the full mask, and block barriers reached by every thread of the block.

#ifndef GEAR_COMMON_CUH
#define GEAR_COMMON_CUH

typedef unsigned long long gear_u64;
typedef long long gear_i64;
typedef unsigned int gear_u32;

#define GEAR_FULL_MASK 0xffffffffu

// Largest finite float and double, spelled out so no header is needed.
#define GEAR_FLT_MAX 3.402823466e+38
#define GEAR_DBL_MAX 1.7976931348623157e+308

// Status bits written by the selection kernels (a device int the host reads back).
#define GEAR_STATUS_BAD_WEIGHT 1    // a weight is negative, NaN or infinite
#define GEAR_STATUS_ZERO_TOTAL 2    // every weight is zero
#define GEAR_STATUS_BAD_TOTAL 4     // the sum of the weights overflows
#define GEAR_STATUS_BAD_DRAW 8      // a draw is outside [0, 1)
#define GEAR_STATUS_INTERNAL 16     // an invariant of the kernels failed

template <typename W>
struct gear_limits;
template <>
struct gear_limits<float> {
  static __device__ __forceinline__ double max_finite() { return GEAR_FLT_MAX; }
};
template <>
struct gear_limits<double> {
  static __device__ __forceinline__ double max_finite() { return GEAR_DBL_MAX; }
};

#endif
