// fakecuda.cc: a fake libcuda.so.1 for gear's tests on machines without a GPU.
//
// It exports the driver entry points gear binds, under their real (versioned)
// names and C signatures. "Device" memory is host memory; device pointers of
// registered or mapped host memory are the host addresses. Modules are PTX text:
// the fake parses each .entry and its .param list, records every launch with the
// bytes of every kernel parameter, and, for gear's own kernels, runs them: the
// kernel source is compiled into this library against emu.h, so a launch
// executes the very code nvcc compiles, on CPU fibers.
//
// The fake is strict where the real driver is: calls that need a context fail
// with CUDA_ERROR_INVALID_CONTEXT unless the calling thread made one current,
// copies must stay inside known allocations, and a released primary context is
// gone. Tests steer and inspect it through the fakecuda_* functions at the end.

#include <ucontext.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "emu.h"

#ifndef FAKE_INIT_ERROR
#define FAKE_INIT_ERROR 0
#endif

// ---------------------------------------------------------------------------
// The fiber scheduler behind emu.h.

dim3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;

namespace {

// Context switching. On x86-64 a fiber switch saves the callee-saved registers
// on the fiber's stack and swaps stack pointers (no system call); elsewhere it
// falls back to ucontext.
#if defined(__x86_64__)
extern "C" void gear_emu_swap(void** save_sp, void* load_sp);
asm(R"(
.text
.globl gear_emu_swap
.hidden gear_emu_swap
.type gear_emu_swap,@function
gear_emu_swap:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size gear_emu_swap, .-gear_emu_swap
)");
#define EMU_ASM_SWITCH 1
#else
#define EMU_ASM_SWITCH 0
#endif

struct Fiber {
#if EMU_ASM_SWITCH
  void* sp;
#else
  ucontext_t ctx;
#endif
  char* stack;
  dim3 tid;
  int lane, warp;
  bool done;
  int wait;  // 0 running or runnable, 1 at a block barrier, 2 at a warp barrier
  unsigned xgen;
};

const size_t kStack = 256 * 1024;
const int kMaxThreads = 1024;

Fiber g_fibers[kMaxThreads];
int g_nfib;
Fiber* g_cur;
#if EMU_ASM_SWITCH
void* g_sched_sp;
#else
ucontext_t g_sched;
#endif
int g_block_live, g_block_arrived;
int g_warp_live[32], g_warp_arrived[32];
uint64_t g_xslots[2][32][32];
void (*g_thunk)(void**);
void** g_params;

void yield_to_scheduler() {
#if EMU_ASM_SWITCH
  gear_emu_swap(&g_cur->sp, g_sched_sp);
#else
  swapcontext(&g_cur->ctx, &g_sched);
#endif
}

void run_fiber(Fiber* f) {
  g_cur = f;
  emu_threadIdx = f->tid;
#if EMU_ASM_SWITCH
  gear_emu_swap(&g_sched_sp, f->sp);
#else
  swapcontext(&g_sched, &f->ctx);
#endif
}

void release_block() {
  for (int i = 0; i < g_nfib; i++) {
    if (g_fibers[i].wait == 1) g_fibers[i].wait = 0;
  }
  g_block_arrived = 0;
}

void release_warp(int w) {
  for (int i = w * 32; i < g_nfib && i < w * 32 + 32; i++) {
    if (g_fibers[i].wait == 2) g_fibers[i].wait = 0;
  }
  g_warp_arrived[w] = 0;
}

void warp_barrier() {
  const int w = g_cur->warp;
  g_cur->wait = 2;
  if (++g_warp_arrived[w] == g_warp_live[w]) {
    release_warp(w);
  } else {
    yield_to_scheduler();
  }
}

void fiber_main() {
  g_thunk(g_params);
  Fiber* f = g_cur;
  f->done = true;
  f->wait = 0;
  g_block_live--;
  g_warp_live[f->warp]--;
  if (g_block_arrived > 0 && g_block_arrived == g_block_live) release_block();
  if (g_warp_arrived[f->warp] > 0 && g_warp_arrived[f->warp] == g_warp_live[f->warp]) {
    release_warp(f->warp);
  }
}

#if EMU_ASM_SWITCH
// fiber_entry is where a new fiber's first switch returns to.
void fiber_entry() {
  fiber_main();
  yield_to_scheduler();  // a finished fiber is never resumed
  abort();
}
#endif

void init_fiber(Fiber& f) {
  if (f.stack == nullptr) f.stack = (char*)malloc(kStack);
#if EMU_ASM_SWITCH
  // Stack top: six zero registers for gear_emu_swap to pop, then the return
  // address fiber_entry, leaving the stack as a call would (rsp = 8 mod 16).
  uintptr_t top = ((uintptr_t)f.stack + kStack) & ~(uintptr_t)15;
  void** sp = (void**)(top - 64);
  for (int i = 0; i < 6; i++) sp[i] = nullptr;
  sp[6] = (void*)&fiber_entry;
  sp[7] = nullptr;
  f.sp = sp;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack;
  f.ctx.uc_stack.ss_size = kStack;
  f.ctx.uc_link = &g_sched;
  makecontext(&f.ctx, fiber_main, 0);
#endif
}

// run_block runs one block to completion; false on a deadlock.
bool run_block(const dim3& bdim) {
  const int n = (int)(bdim.x * bdim.y * bdim.z);
  g_nfib = n;
  g_block_live = n;
  g_block_arrived = 0;
  for (int w = 0; w < 32; w++) {
    g_warp_live[w] = 0;
    g_warp_arrived[w] = 0;
  }
  for (int i = 0; i < n; i++) {
    Fiber& f = g_fibers[i];
    f.tid.x = i % bdim.x;
    f.tid.y = (i / bdim.x) % bdim.y;
    f.tid.z = i / (bdim.x * bdim.y);
    f.lane = i % 32;
    f.warp = i / 32;
    f.done = false;
    f.wait = 0;
    f.xgen = 0;
    g_warp_live[f.warp]++;
    init_fiber(f);
  }
  // Threads run last first, and blocks too (run_grid): a GPU runs them in no
  // set order, and a kernel whose result depends on the order (two threads
  // writing one word) then gives another result here than its twin.
  int remaining = n;
  while (remaining > 0) {
    bool ran = false;
    for (int i = n - 1; i >= 0; i--) {
      Fiber& f = g_fibers[i];
      if (f.done || f.wait != 0) continue;
      run_fiber(&f);
      ran = true;
      if (f.done) remaining--;
    }
    if (!ran) return false;
  }
  return true;
}

// run_grid runs a whole launch; false on a deadlock.
bool run_grid(void (*thunk)(void**), void** params, dim3 grid, dim3 block) {
  g_thunk = thunk;
  g_params = params;
  emu_gridDim = grid;
  emu_blockDim = block;
  for (unsigned z = grid.z; z-- > 0;) {
    for (unsigned y = grid.y; y-- > 0;) {
      for (unsigned x = grid.x; x-- > 0;) {
        emu_blockIdx = dim3{x, y, z};
        if (!run_block(block)) return false;
      }
    }
  }
  return true;
}

}  // namespace

void emu_syncthreads() {
  g_cur->wait = 1;
  if (++g_block_arrived == g_block_live) {
    release_block();
  } else {
    yield_to_scheduler();
  }
}

void emu_syncwarp() { warp_barrier(); }

const uint64_t* emu_exchange(uint64_t mine) {
  const unsigned g = g_cur->xgen++ & 1;
  g_xslots[g][g_cur->warp][g_cur->lane] = mine;
  warp_barrier();
  return g_xslots[g][g_cur->warp];
}

int emu_lane() { return g_cur->lane; }

int emu_warp_lanes() {
  const int rest = g_nfib - g_cur->warp * 32;
  return rest < 32 ? rest : 32;
}

// ---------------------------------------------------------------------------
// gear's kernels, compiled for the host, and their parameter unpacking.

#include "gear.cu"

namespace {

typedef void (*thunk_t)(void**);

template <typename... A, size_t... I>
void invoke(void (*f)(A...), void** p, std::index_sequence<I...>) {
  f(*static_cast<A*>(p[I])...);
}

template <auto F>
struct Thunk;
template <typename... A, void (*F)(A...)>
struct Thunk<F> {
  static void run(void** p) { invoke(F, p, std::index_sequence_for<A...>{}); }
  static std::vector<int> sizes() { return std::vector<int>{(int)sizeof(A)...}; }
};

struct Known {
  const char* name;
  thunk_t run;
  std::vector<int> sizes;
};

#define KNOWN(k) Known{#k, Thunk<k>::run, Thunk<k>::sizes()}

const std::vector<Known>& known_kernels() {
  static const std::vector<Known> k = {
      KNOWN(gear_gather_v16),    KNOWN(gear_gather_v4),        KNOWN(gear_gather_v1),
      KNOWN(gear_gather_rows_v16), KNOWN(gear_gather_rows_v4), KNOWN(gear_gather_rows_v1),
      KNOWN(gear_gather_rows256_v16), KNOWN(gear_gather_rows256_v4), KNOWN(gear_gather_rows256_v1),
      KNOWN(gear_ws_tiles_f32),  KNOWN(gear_ws_tiles_f64),     KNOWN(gear_ws_scan),
      KNOWN(gear_ws_draws_f32),  KNOWN(gear_ws_draws_f64),     KNOWN(gear_topk_init),
      KNOWN(gear_topk_hist_f32), KNOWN(gear_topk_hist_f64),    KNOWN(gear_topk_select),
      KNOWN(gear_topk_collect_f32), KNOWN(gear_topk_collect_f64),
      KNOWN(gear_mm_f32),        KNOWN(gear_colsum_f32),       KNOWN(gear_dqn_td),
      KNOWN(gear_dqn_td_sum),    KNOWN(gear_sumsq_f32),        KNOWN(gear_clip_scale),
      KNOWN(gear_adam_f32),      KNOWN(gear_soft_update_f32),  KNOWN(gear_prio_scatter),
      KNOWN(gear_is_weights),
  };
  return k;
}

// ---------------------------------------------------------------------------
// Driver state.

typedef int CUresult;
typedef int CUdevice;
typedef uintptr_t CUdeviceptr;

enum {
  OK = 0,
  INVALID_VALUE = 1,
  OUT_OF_MEMORY = 2,
  INVALID_DEVICE = 101,
  INVALID_IMAGE = 200,
  INVALID_CONTEXT = 201,
  CONTEXT_IS_DESTROYED = 709,
  UNSUPPORTED_PTX_VERSION = 222,
  INVALID_HANDLE = 400,
  NOT_FOUND = 500,
  NOT_READY = 600,
  LAUNCH_TIMEOUT = 702,
  ALREADY_MAPPED = 208,
  NOT_SUPPORTED = 801,
  ALREADY_REGISTERED = 712,
  NOT_REGISTERED = 713,
  LAUNCH_FAILED = 719,
};

const size_t kMaxAlloc = (size_t)1 << 34;  // larger requests are out of memory

struct Context;

// Every allocation, registration, module, stream and event belongs to the
// context that was current when it was made. When a primary context's last
// reference is released the driver destroys the context and everything in it,
// as the real one does: later calls that name those objects fail, even through
// the same device's context retained anew.
struct Region {
  size_t size;
  unsigned flags;
  Context* ctx;
  int fd;  // device memory: the memfd behind it, so another process can map it (CUDA IPC)
};

struct Entry {
  std::string name;
  std::vector<int> psizes;
  thunk_t run;
};

struct Module {
  std::vector<Entry> entries;
  Context* ctx;
};

struct Function {
  Module* mod;
  size_t entry;
};

struct Stream {
  int holds;
  Context* ctx;
};

struct Event {
  std::chrono::steady_clock::time_point t;
  bool recorded;
  uintptr_t stream;  // where it was last recorded: it completes when that stream is idle
  Context* ctx;
};

struct Context {
  int refs;
};

struct LaunchRecord {
  std::string name;
  unsigned dims[6];
  unsigned shmem;
  uintptr_t stream;
  std::vector<std::vector<unsigned char>> params;
};

std::recursive_mutex g_mu;  // driver state
std::mutex g_launch_mu;     // the emulator
std::map<uintptr_t, Region> g_dev;   // device allocations
std::map<uintptr_t, Region> g_host;  // cuMemHostAlloc / cuMemAllocHost
std::map<uintptr_t, Region> g_reg;   // cuMemHostRegister
std::map<uintptr_t, Region> g_ipc;   // cuIpcOpenMemHandle: another process's device memory
std::map<uintptr_t, int> g_ipc_refs; // the opens of each g_ipc mapping not yet closed

// A synchronous copy from pageable host memory to the device returns once the
// driver has staged the source, before its DMA reaches the device ("the DMA to
// final destination may not have completed"): work on a non-blocking stream
// can run before it lands (an H200 gathered rows that a fill copied before it
// then overwrote). The fake keeps such copies in the legacy default stream and
// lands them only where that stream is synchronized or used again (land_legacy),
// so that a program that relies on them having landed fails here too.
struct PendingCopy {
  uintptr_t dst;
  std::vector<unsigned char> data;
};
std::vector<PendingCopy> g_legacy;

// land_legacy completes the legacy stream's pending copies (g_mu held).
void land_legacy() {
  for (auto& c : g_legacy) memmove((void*)c.dst, c.data.data(), c.data.size());
  g_legacy.clear();
}

// legacy tells whether s names the legacy default stream (0 or CU_STREAM_LEGACY).
bool legacy(uintptr_t s) { return s == 0 || s == 1; }

std::map<uintptr_t, Module*> g_modules;
std::map<uintptr_t, Function*> g_functions;
std::map<uintptr_t, Stream*> g_streams;
std::map<uintptr_t, Event*> g_events;
Stream g_default_stream;
Context g_ctx[8];
thread_local uintptr_t t_current;
LaunchRecord g_last;
int g_launches;
std::string g_fail_fn;
int g_fail_code, g_fail_times;
int g_reclaimed;  // objects destroyed with their context (freed after release: a leak)

int device_count() {
  const char* e = getenv("GEAR_FAKE_CUDA_DEVICES");
  int n = e ? atoi(e) : 2;
  return n < 0 ? 0 : (n > 8 ? 8 : n);
}

bool injected(const char* fn, CUresult* r) {
  std::lock_guard<std::recursive_mutex> l(g_mu);
  if (g_fail_times > 0 && g_fail_fn == fn) {
    g_fail_times--;
    *r = g_fail_code;
    return true;
  }
  return false;
}

#define FAIL_POINT(fn)                  \
  do {                                  \
    CUresult injected_r;                \
    if (injected(fn, &injected_r)) {    \
      return injected_r;                \
    }                                   \
  } while (0)

Context* current() { return (Context*)t_current; }

// dev_memfd makes the memfd behind an allocation of n bytes, raising the
// process's open-file limit to its hard limit the first time.
int dev_memfd(size_t n) {
  static std::once_flag once;
  std::call_once(once, [] {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
    }
  });
  int fd = memfd_create("fakecuda", MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (ftruncate(fd, (off_t)n) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// release_region frees a region's memory: a mapping (device memory, IPC) or
// a host allocation.
void release_region(uintptr_t p, const Region& r, bool mapped) {
  if (mapped) {
    munmap((void*)p, r.size);
    if (r.fd >= 0) close(r.fd);
  } else {
    free((void*)p);
  }
}

// context_status is what a call that needs a context finds: none current
// (INVALID_CONTEXT), or a primary context whose last reference was released
// (CONTEXT_IS_DESTROYED), as the real driver reports.
CUresult context_status() {
  if (t_current == 0) return INVALID_CONTEXT;
  std::lock_guard<std::recursive_mutex> l(g_mu);
  return current()->refs > 0 ? OK : CONTEXT_IS_DESTROYED;
}

#define NEED_CONTEXT()                        \
  do {                                        \
    CUresult ctx_r = context_status();        \
    if (ctx_r != OK) {                        \
      return ctx_r;                           \
    }                                         \
  } while (0)

// reclaim destroys everything that belongs to c (its last reference is gone).
void reclaim(Context* c) {
  land_legacy();
  for (auto* m : {&g_dev, &g_host, &g_ipc}) {
    for (auto it = m->begin(); it != m->end();) {
      if (it->second.ctx == c) {
        release_region(it->first, it->second, m != &g_host);
        if (m == &g_ipc) g_ipc_refs.erase(it->first);
        it = m->erase(it);
        g_reclaimed++;
      } else {
        ++it;
      }
    }
  }
  for (auto it = g_reg.begin(); it != g_reg.end();) {
    if (it->second.ctx == c) {
      it = g_reg.erase(it);
      g_reclaimed++;
    } else {
      ++it;
    }
  }
  for (auto it = g_modules.begin(); it != g_modules.end();) {
    if (it->second->ctx == c) {
      for (auto f = g_functions.begin(); f != g_functions.end();) {
        if (f->second->mod == it->second) {
          delete f->second;
          f = g_functions.erase(f);
        } else {
          ++f;
        }
      }
      delete it->second;
      it = g_modules.erase(it);
      g_reclaimed++;
    } else {
      ++it;
    }
  }
  for (auto it = g_streams.begin(); it != g_streams.end();) {
    if (it->second->ctx == c) {
      delete it->second;
      it = g_streams.erase(it);
      g_reclaimed++;
    } else {
      ++it;
    }
  }
  for (auto it = g_events.begin(); it != g_events.end();) {
    if (it->second->ctx == c) {
      delete it->second;
      it = g_events.erase(it);
      g_reclaimed++;
    } else {
      ++it;
    }
  }
}

// inside reports whether [p, p+n) lies in one region of m.
bool inside(const std::map<uintptr_t, Region>& m, uintptr_t p, size_t n, unsigned need_flags = 0) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return false;
  --it;
  return p >= it->first && p + n <= it->first + it->second.size &&
         (it->second.flags & need_flags) == need_flags;
}

bool device_range(uintptr_t p, size_t n) {
  return inside(g_dev, p, n) || inside(g_ipc, p, n) || inside(g_host, p, n, 2) || inside(g_reg, p, n, 2);
}

Stream* stream_of(uintptr_t s) {
  if (legacy(s)) return &g_default_stream;
  auto it = g_streams.find(s);
  return it == g_streams.end() ? nullptr : it->second;
}

int param_size(const std::string& type) {
  if (type.size() < 3) return 0;
  int bits = atoi(type.c_str() + 2);
  return bits / 8;
}

// parse_ptx reads every .entry and its parameter sizes; false if the image is
// not PTX gear's driver would load.
bool parse_ptx(const char* img, Module* m, CUresult* err) {
  std::string s(img);
  size_t v = s.find(".version ");
  if (v == std::string::npos || s.find(".target ") == std::string::npos) {
    *err = INVALID_IMAGE;
    return false;
  }
  int major = 0, minor = 0;
  sscanf(s.c_str() + v, ".version %d.%d", &major, &minor);
  if (major > 9 || (major == 9 && minor > 0)) {
    *err = UNSUPPORTED_PTX_VERSION;
    return false;
  }
  size_t pos = 0;
  while ((pos = s.find(".entry ", pos)) != std::string::npos) {
    pos += 7;
    size_t open = s.find('(', pos);
    size_t close = s.find(')', open);
    if (open == std::string::npos || close == std::string::npos) {
      *err = INVALID_IMAGE;
      return false;
    }
    Entry e;
    e.name = s.substr(pos, open - pos);
    while (!e.name.empty() && (e.name.back() == ' ' || e.name.back() == '\n')) e.name.pop_back();
    e.run = nullptr;
    std::string params = s.substr(open + 1, close - open - 1);
    size_t p = 0;
    while ((p = params.find(".param", p)) != std::string::npos) {
      p += 6;
      size_t end = params.find_first_of(",", p);
      std::string decl = params.substr(p, end == std::string::npos ? std::string::npos : end - p);
      int size = 0;
      size_t t = decl.find(" .");
      size_t align = decl.find(".align");
      if (align != std::string::npos) t = decl.find(" .", align + 6);
      if (t != std::string::npos) {
        size_t te = decl.find(' ', t + 1);
        size = param_size(decl.substr(t + 1, te - t - 1));
        size_t br = decl.find('[');
        if (br != std::string::npos) size *= atoi(decl.c_str() + br + 1);
      }
      e.psizes.push_back(size);
    }
    for (const Known& k : known_kernels()) {
      if (e.name == k.name) {
        if (k.sizes != e.psizes) {
          fprintf(stderr, "fakecuda: kernel %s: PTX parameters do not match the source\n", k.name);
          *err = INVALID_IMAGE;
          return false;
        }
        e.run = k.run;
      }
    }
    m->entries.push_back(e);
    pos = close;
  }
  return true;
}

const char* error_name(int code) {
  switch (code) {
    case 0: return "CUDA_SUCCESS";
    case 1: return "CUDA_ERROR_INVALID_VALUE";
    case 2: return "CUDA_ERROR_OUT_OF_MEMORY";
    case 3: return "CUDA_ERROR_NOT_INITIALIZED";
    case 100: return "CUDA_ERROR_NO_DEVICE";
    case 101: return "CUDA_ERROR_INVALID_DEVICE";
    case 200: return "CUDA_ERROR_INVALID_IMAGE";
    case 201: return "CUDA_ERROR_INVALID_CONTEXT";
    case 208: return "CUDA_ERROR_ALREADY_MAPPED";
    case 709: return "CUDA_ERROR_CONTEXT_IS_DESTROYED";
    case 222: return "CUDA_ERROR_UNSUPPORTED_PTX_VERSION";
    case 400: return "CUDA_ERROR_INVALID_HANDLE";
    case 500: return "CUDA_ERROR_NOT_FOUND";
    case 600: return "CUDA_ERROR_NOT_READY";
    case 700: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case 702: return "CUDA_ERROR_LAUNCH_TIMEOUT";
    case 712: return "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED";
    case 713: return "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED";
    case 719: return "CUDA_ERROR_LAUNCH_FAILED";
    case 999: return "CUDA_ERROR_UNKNOWN";
  }
  return nullptr;
}

const char* error_string(int code) {
  switch (code) {
    case 0: return "no error";
    case 1: return "invalid argument";
    case 2: return "out of memory";
    case 3: return "initialization error";
    case 100: return "no CUDA-capable device is detected";
    case 101: return "invalid device ordinal";
    case 200: return "device kernel image is invalid";
    case 201: return "invalid device context";
    case 208: return "resource already mapped";
    case 709: return "context is destroyed";
    case 222: return "the provided PTX was compiled with an unsupported toolchain.";
    case 400: return "invalid resource handle";
    case 500: return "named symbol not found";
    case 600: return "device not ready";
    case 700: return "an illegal memory access was encountered";
    case 702: return "the launch timed out and was terminated";
    case 712: return "part or all of the requested memory range is already mapped";
    case 713: return "pointer does not correspond to a registered memory region";
    case 719: return "unspecified launch failure";
    case 999: return "unknown error";
  }
  return nullptr;
}

}  // namespace

// ---------------------------------------------------------------------------
// The driver API. Every call that can fail takes a failure that
// fakecuda_fail injects; calls that share their work use the inner forms
// below, so that a failure injected into one does not reach the other.

extern "C" {

CUresult host_alloc(void** p, size_t n, unsigned int flags);
CUresult event_query(uintptr_t e);
CUresult event_elapsed(float* ms, uintptr_t a, uintptr_t b);

CUresult cuInit(unsigned int flags) {
  (void)flags;
  return FAKE_INIT_ERROR;
}

CUresult cuDriverGetVersion(int* v) {
  *v = 13000;
  return OK;
}

CUresult cuGetErrorName(CUresult code, const char** s) {
  *s = error_name(code);
  return *s ? OK : INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult code, const char** s) {
  *s = error_string(code);
  return *s ? OK : INVALID_VALUE;
}

CUresult cuDeviceGetCount(int* n) {
  FAIL_POINT("cuDeviceGetCount");
  *n = device_count();
  return OK;
}

CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  FAIL_POINT("cuDeviceGet");
  if (ordinal < 0 || ordinal >= device_count()) return INVALID_DEVICE;
  *d = ordinal;
  return OK;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  FAIL_POINT("cuDeviceGetName");
  if (d < 0 || d >= device_count()) return INVALID_DEVICE;
  snprintf(name, len, "Fake GPU %d (gear cudatest)", d);
  return OK;
}

CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice d) {
  FAIL_POINT("cuDeviceGetAttribute");
  if (d < 0 || d >= device_count()) return INVALID_DEVICE;
  switch (attr) {
    case 1: *v = 1024; break;        // max threads per block
    case 5: *v = 2147483647; break;  // max grid x
    case 6: *v = 65535; break;       // max grid y
    case 8: *v = 49152; break;       // shared memory per block
    case 10: *v = 32; break;         // warp size
    case 16: *v = 132; break;        // multiprocessors
    case 19: *v = 1; break;          // can map host memory
    case 33: *v = 0x10 + d; break;   // PCI bus
    case 41: *v = 1; break;          // unified addressing
    case 75: *v = 9; break;          // compute capability
    case 76: *v = 0; break;
    case 99: *v = 1; break;          // host register supported
    default: *v = 0;
  }
  return OK;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
  FAIL_POINT("cuDeviceTotalMem_v2");
  if (d < 0 || d >= device_count()) return INVALID_DEVICE;
  *bytes = (size_t)80 << 30;
  return OK;
}

CUresult cuDevicePrimaryCtxRetain(uintptr_t* ctx, CUdevice d) {
  FAIL_POINT("cuDevicePrimaryCtxRetain");
  if (d < 0 || d >= device_count()) return INVALID_DEVICE;
  std::lock_guard<std::recursive_mutex> l(g_mu);
  g_ctx[d].refs++;
  *ctx = (uintptr_t)&g_ctx[d];
  return OK;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  FAIL_POINT("cuDevicePrimaryCtxRelease_v2");
  if (d < 0 || d >= device_count()) return INVALID_DEVICE;
  std::lock_guard<std::recursive_mutex> l(g_mu);
  if (g_ctx[d].refs <= 0) return INVALID_CONTEXT;
  if (--g_ctx[d].refs == 0) reclaim(&g_ctx[d]);
  return OK;
}

CUresult cuCtxSetCurrent(uintptr_t ctx) {
  FAIL_POINT("cuCtxSetCurrent");
  t_current = ctx;
  return OK;
}

CUresult cuCtxSynchronize(void) {
  FAIL_POINT("cuCtxSynchronize");
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  land_legacy();
  return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
  FAIL_POINT("cuMemAlloc_v2");
  NEED_CONTEXT();
  if (n == 0) return INVALID_VALUE;
  if (n > kMaxAlloc) return OUT_OF_MEMORY;
  // Device memory is a shared mapping of a memfd, so that a CUDA IPC handle
  // can carry it to another process (cuIpcGetMemHandle).
  int fd = dev_memfd(n);
  if (fd < 0) return OUT_OF_MEMORY;
  void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    close(fd);
    return OUT_OF_MEMORY;
  }
  memset(m, 0xa5, n);  // device memory is not zeroed
  std::lock_guard<std::recursive_mutex> l(g_mu);
  g_dev[(uintptr_t)m] = Region{n, 0, current(), fd};
  *p = (CUdeviceptr)m;
  return OK;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
  FAIL_POINT("cuMemFree_v2");
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  auto it = g_dev.find(p);
  if (it == g_dev.end()) return INVALID_VALUE;
  land_legacy();  // cuMemFree waits for the work before it
  release_region(it->first, it->second, true);
  g_dev.erase(it);
  return OK;
}

CUresult cuMemHostAlloc(void** p, size_t n, unsigned int flags) {
  FAIL_POINT("cuMemHostAlloc");
  return host_alloc(p, n, flags);
}

CUresult host_alloc(void** p, size_t n, unsigned int flags) {
  NEED_CONTEXT();
  if (n == 0) return INVALID_VALUE;
  if (n > kMaxAlloc) return OUT_OF_MEMORY;
  void* m = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  if (!m) return OUT_OF_MEMORY;
  std::lock_guard<std::recursive_mutex> l(g_mu);
  g_host[(uintptr_t)m] = Region{n, flags, current(), -1};
  *p = m;
  return OK;
}

CUresult cuMemAllocHost_v2(void** p, size_t n) {
  FAIL_POINT("cuMemAllocHost_v2");
  return host_alloc(p, n, 0);
}

CUresult cuMemFreeHost(void* p) {
  FAIL_POINT("cuMemFreeHost");
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  auto it = g_host.find((uintptr_t)p);
  if (it == g_host.end()) return INVALID_VALUE;
  g_host.erase(it);
  free(p);
  return OK;
}

CUresult cuMemHostRegister_v2(void* p, size_t n, unsigned int flags) {
  FAIL_POINT("cuMemHostRegister_v2");
  NEED_CONTEXT();
  if (p == nullptr || n == 0) return INVALID_VALUE;
  std::lock_guard<std::recursive_mutex> l(g_mu);
  uintptr_t a = (uintptr_t)p;
  for (auto& r : g_reg) {
    if (a < r.first + r.second.size && r.first < a + n) return ALREADY_REGISTERED;
  }
  g_reg[a] = Region{n, flags, current(), -1};
  return OK;
}

CUresult cuMemHostUnregister(void* p) {
  FAIL_POINT("cuMemHostUnregister");
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  auto it = g_reg.find((uintptr_t)p);
  if (it == g_reg.end()) return NOT_REGISTERED;
  g_reg.erase(it);
  return OK;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* d, void* p, unsigned int flags) {
  FAIL_POINT("cuMemHostGetDevicePointer_v2");
  NEED_CONTEXT();
  if (flags != 0) return INVALID_VALUE;
  std::lock_guard<std::recursive_mutex> l(g_mu);
  uintptr_t a = (uintptr_t)p;
  if (!inside(g_reg, a, 1, 2) && !inside(g_host, a, 1, 2)) return INVALID_VALUE;
  *d = a;
  return OK;
}

// copy_checked copies n bytes after checking the device ends. on_legacy: the
// copy is in the legacy default stream, after its pending copies.
static CUresult copy_checked(uintptr_t dst, bool dst_dev, uintptr_t src, bool src_dev, size_t n,
                             bool on_legacy) {
  NEED_CONTEXT();
  {
    std::lock_guard<std::recursive_mutex> l(g_mu);
    if ((dst_dev && !device_range(dst, n)) || (src_dev && !device_range(src, n))) return INVALID_VALUE;
    if (on_legacy) land_legacy();
  }
  memmove((void*)dst, (const void*)src, n);
  return OK;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  FAIL_POINT("cuMemcpyHtoD_v2");
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  if (!device_range(dst, n)) return INVALID_VALUE;
  const uintptr_t a = (uintptr_t)src;
  if (n > 0 && !inside(g_host, a, n) && !inside(g_reg, a, n)) {
    // Pageable: staged now, landed later (g_legacy).
    const unsigned char* b = (const unsigned char*)src;
    g_legacy.push_back(PendingCopy{dst, std::vector<unsigned char>(b, b + n)});
    return OK;
  }
  land_legacy();
  memmove((void*)dst, src, n);
  return OK;
}

CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  FAIL_POINT("cuMemcpyDtoH_v2");
  return copy_checked((uintptr_t)dst, false, src, true, n, true);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, uintptr_t s) {
  FAIL_POINT("cuMemcpyHtoDAsync_v2");
  {
    std::lock_guard<std::recursive_mutex> l(g_mu);
    if (!stream_of(s)) return INVALID_HANDLE;
  }
  return copy_checked(dst, true, (uintptr_t)src, false, n, legacy(s));
}

CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, uintptr_t s) {
  FAIL_POINT("cuMemcpyDtoHAsync_v2");
  {
    std::lock_guard<std::recursive_mutex> l(g_mu);
    if (!stream_of(s)) return INVALID_HANDLE;
  }
  return copy_checked((uintptr_t)dst, false, src, true, n, legacy(s));
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, uintptr_t s) {
  FAIL_POINT("cuMemcpyDtoDAsync_v2");
  {
    std::lock_guard<std::recursive_mutex> l(g_mu);
    if (!stream_of(s)) return INVALID_HANDLE;
  }
  return copy_checked(dst, true, src, true, n, legacy(s));
}

// CUmemcpyAttributes_v1: how a batch's copies read their sources.
struct MemcpyAttributes {
  unsigned src_access_order;  // 1 stream, 2 during the call, 3 any
  unsigned src_loc_type;
  int src_loc_id;
  unsigned dst_loc_type;
  int dst_loc_id;
  unsigned flags;  // CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE (1) only
};

// cuMemcpyBatchAsync (CUDA 12.8's form, with failIdx), as strict as the
// driver: the legacy default stream is refused, every copy needs attributes
// (attrsIdxs starts at 0 and rises, at most count of them) with a valid source
// order, and each copy's ends must lie in memory CUDA knows (device memory,
// or host memory it allocated or registered); failIdx names the copy that
// failed, or SIZE_MAX when the batch as a whole is refused.
CUresult cuMemcpyBatchAsync(const uintptr_t* dsts, const uintptr_t* srcs, const size_t* sizes, size_t count,
                            const MemcpyAttributes* attrs, const size_t* attrs_idxs, size_t num_attrs,
                            size_t* fail_idx, uintptr_t s) {
  FAIL_POINT("cuMemcpyBatchAsync");
  NEED_CONTEXT();
  if (fail_idx != nullptr) *fail_idx = SIZE_MAX;
  std::lock_guard<std::recursive_mutex> l(g_mu);
  if (legacy(s)) return INVALID_VALUE;
  if (!stream_of(s)) return INVALID_HANDLE;
  if (count == 0 || dsts == nullptr || srcs == nullptr || sizes == nullptr || fail_idx == nullptr) return INVALID_VALUE;
  if (num_attrs == 0 || num_attrs > count || attrs == nullptr || attrs_idxs == nullptr || attrs_idxs[0] != 0)
    return INVALID_VALUE;
  for (size_t a = 0; a < num_attrs; a++) {
    if (a > 0 && (attrs_idxs[a] <= attrs_idxs[a - 1] || attrs_idxs[a] >= count)) return INVALID_VALUE;
    if (attrs[a].src_access_order < 1 || attrs[a].src_access_order > 3 || (attrs[a].flags & ~1u) != 0)
      return INVALID_VALUE;
  }
  auto known = [](uintptr_t p, size_t n) {
    return device_range(p, n) || inside(g_host, p, n) || inside(g_reg, p, n);
  };
  for (size_t i = 0; i < count; i++) {
    if (sizes[i] == 0 || !known(dsts[i], sizes[i]) || !known(srcs[i], sizes[i])) {
      *fail_idx = i;
      return INVALID_VALUE;
    }
  }
  for (size_t i = 0; i < count; i++) memmove((void*)dsts[i], (const void*)srcs[i], sizes[i]);
  return OK;
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, uintptr_t s) {
  FAIL_POINT("cuMemsetD8Async");
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  if (!stream_of(s)) return INVALID_HANDLE;
  if (!device_range(dst, n)) return INVALID_VALUE;
  if (legacy(s)) land_legacy();
  memset((void*)dst, v, n);
  return OK;
}

CUresult cuModuleLoadData(uintptr_t* mod, const void* image) {
  FAIL_POINT("cuModuleLoadData");
  NEED_CONTEXT();
  if (image == nullptr) return INVALID_VALUE;
  Module* m = new Module;
  CUresult err = OK;
  if (!parse_ptx((const char*)image, m, &err)) {
    delete m;
    return err;
  }
  std::lock_guard<std::recursive_mutex> l(g_mu);
  m->ctx = current();
  g_modules[(uintptr_t)m] = m;
  *mod = (uintptr_t)m;
  return OK;
}

CUresult cuModuleUnload(uintptr_t mod) {
  FAIL_POINT("cuModuleUnload");
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  auto it = g_modules.find(mod);
  if (it == g_modules.end()) return INVALID_HANDLE;
  for (auto f = g_functions.begin(); f != g_functions.end();) {
    if (f->second->mod == it->second) {
      delete f->second;
      f = g_functions.erase(f);
    } else {
      ++f;
    }
  }
  delete it->second;
  g_modules.erase(it);
  return OK;
}

CUresult cuModuleGetFunction(uintptr_t* f, uintptr_t mod, const char* name) {
  FAIL_POINT("cuModuleGetFunction");
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  auto it = g_modules.find(mod);
  if (it == g_modules.end()) return INVALID_HANDLE;
  Module* m = it->second;
  for (size_t i = 0; i < m->entries.size(); i++) {
    if (m->entries[i].name == name) {
      Function* fn = new Function{m, i};
      g_functions[(uintptr_t)fn] = fn;
      *f = (uintptr_t)fn;
      return OK;
    }
  }
  return NOT_FOUND;
}

CUresult cuLaunchKernel(uintptr_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shmem, uintptr_t s, void** params,
                        void** extra) {
  FAIL_POINT("cuLaunchKernel");
  NEED_CONTEXT();
  thunk_t run = nullptr;
  {
    std::lock_guard<std::recursive_mutex> l(g_mu);
    auto it = g_functions.find(f);
    if (it == g_functions.end()) return INVALID_HANDLE;
    if (!stream_of(s)) return INVALID_HANDLE;
    if (extra != nullptr) return INVALID_VALUE;
    const unsigned long long threads = (unsigned long long)bx * by * bz;
    if (gx == 0 || gy == 0 || gz == 0 || threads == 0 || threads > 1024 || gy > 65535 ||
        gz > 65535 || bz > 64 || shmem > 49152) {
      return INVALID_VALUE;
    }
    const Entry& e = it->second->mod->entries[it->second->entry];
    if (!e.psizes.empty() && params == nullptr) return INVALID_VALUE;
    g_last.name = e.name;
    unsigned dims[6] = {gx, gy, gz, bx, by, bz};
    memcpy(g_last.dims, dims, sizeof dims);
    g_last.shmem = shmem;
    g_last.stream = s;
    g_last.params.clear();
    for (size_t i = 0; i < e.psizes.size(); i++) {
      const unsigned char* b = (const unsigned char*)params[i];
      g_last.params.emplace_back(b, b + e.psizes[i]);
    }
    g_launches++;
    run = e.run;
    if (legacy(s)) land_legacy();
  }
  if (run == nullptr) return OK;  // recorded only
  std::lock_guard<std::mutex> l(g_launch_mu);
  if (!run_grid(run, params, dim3{gx, gy, gz}, dim3{bx, by, bz})) {
    fprintf(stderr, "fakecuda: kernel %s deadlocked at a barrier\n", g_last.name.c_str());
    return LAUNCH_FAILED;
  }
  return OK;
}

CUresult cuStreamCreate(uintptr_t* s, unsigned int flags) {
  FAIL_POINT("cuStreamCreate");
  (void)flags;
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  Stream* st = new Stream{0, current()};
  g_streams[(uintptr_t)st] = st;
  *s = (uintptr_t)st;
  return OK;
}

CUresult cuStreamDestroy_v2(uintptr_t s) {
  FAIL_POINT("cuStreamDestroy_v2");
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  auto it = g_streams.find(s);
  if (it == g_streams.end()) return INVALID_HANDLE;
  delete it->second;
  g_streams.erase(it);
  return OK;
}

CUresult cuStreamQuery(uintptr_t s) {
  FAIL_POINT("cuStreamQuery");
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  Stream* st = stream_of(s);
  if (!st) return INVALID_HANDLE;
  if (legacy(s)) land_legacy();
  return st->holds > 0 ? NOT_READY : OK;
}

CUresult cuStreamSynchronize(uintptr_t s) {
  FAIL_POINT("cuStreamSynchronize");
  NEED_CONTEXT();
  for (int i = 0; i < 300000; i++) {
    {
      std::lock_guard<std::recursive_mutex> l(g_mu);
      Stream* st = stream_of(s);
      if (!st) return INVALID_HANDLE;
      if (legacy(s)) land_legacy();
      if (st->holds == 0) return OK;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return LAUNCH_TIMEOUT;
}

CUresult cuEventCreate(uintptr_t* e, unsigned int flags) {
  FAIL_POINT("cuEventCreate");
  (void)flags;
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  Event* ev = new Event{std::chrono::steady_clock::now(), false, 0, current()};
  g_events[(uintptr_t)ev] = ev;
  *e = (uintptr_t)ev;
  return OK;
}

CUresult cuEventDestroy_v2(uintptr_t e) {
  FAIL_POINT("cuEventDestroy_v2");
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  auto it = g_events.find(e);
  if (it == g_events.end()) return INVALID_HANDLE;
  delete it->second;
  g_events.erase(it);
  return OK;
}

CUresult cuEventRecord(uintptr_t e, uintptr_t s) {
  FAIL_POINT("cuEventRecord");
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  auto it = g_events.find(e);
  if (it == g_events.end() || !stream_of(s)) return INVALID_HANDLE;
  if (legacy(s)) land_legacy();
  it->second->t = std::chrono::steady_clock::now();
  it->second->recorded = true;
  it->second->stream = s;
  return OK;
}

// cuStreamWaitEvent: the fake runs work when it is enqueued, so a wait has
// nothing left to wait for; it checks what the driver checks (the handles, the
// flags).
CUresult cuStreamWaitEvent(uintptr_t s, uintptr_t e, unsigned int flags) {
  FAIL_POINT("cuStreamWaitEvent");
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  if (flags > 1) return INVALID_VALUE;
  if (g_events.find(e) == g_events.end() || !stream_of(s)) return INVALID_HANDLE;
  if (legacy(s)) land_legacy();
  return OK;
}

CUresult event_query(uintptr_t e) {
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  auto it = g_events.find(e);
  if (it == g_events.end()) return INVALID_HANDLE;
  Stream* st = it->second->recorded ? stream_of(it->second->stream) : nullptr;
  return st != nullptr && st->holds > 0 ? NOT_READY : OK;
}

CUresult cuEventQuery(uintptr_t e) {
  FAIL_POINT("cuEventQuery");
  return event_query(e);
}

CUresult cuEventSynchronize(uintptr_t e) {
  FAIL_POINT("cuEventSynchronize");
  for (int i = 0; i < 300000; i++) {
    CUresult r = event_query(e);
    if (r != NOT_READY) return r;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return LAUNCH_TIMEOUT;
}

CUresult cuEventElapsedTime_v2(float* ms, uintptr_t a, uintptr_t b) {
  FAIL_POINT("cuEventElapsedTime_v2");
  return event_elapsed(ms, a, b);
}

CUresult event_elapsed(float* ms, uintptr_t a, uintptr_t b) {
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  auto ia = g_events.find(a), ib = g_events.find(b);
  if (ia == g_events.end() || ib == g_events.end()) return INVALID_HANDLE;
  if (!ia->second->recorded || !ib->second->recorded) return NOT_READY;
  *ms = std::chrono::duration<float, std::milli>(ib->second->t - ia->second->t).count();
  return OK;
}

CUresult cuEventElapsedTime(float* ms, uintptr_t a, uintptr_t b) {
  FAIL_POINT("cuEventElapsedTime");
  return event_elapsed(ms, a, b);
}

// CUDA IPC. A handle (64 bytes) names the exporting process, the memfd behind
// the allocation and its inode, so a stale handle (the memory freed, the fd
// number reused) is refused. As on the real driver: only the base of a
// cuMemAlloc allocation is exported; a handle is not opened in the process
// that made it (CUDA_ERROR_INVALID_CONTEXT); the flags must be
// CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS; cuIpcCloseMemHandle takes only what
// cuIpcOpenMemHandle returned. A handle opened again in the process returns
// the same address and counts one more reference; each open needs its close,
// and the last close unmaps (an H100 with driver 580 opens a handle twice).
struct IpcHandle {
  char magic[8];
  uint64_t pid, fd, ino, size;
  char pad[24];
};
static_assert(sizeof(IpcHandle) == 64, "CUipcMemHandle is 64 bytes");

CUresult cuIpcGetMemHandle(IpcHandle* h, CUdeviceptr p) {
  FAIL_POINT("cuIpcGetMemHandle");
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  auto it = g_dev.find(p);
  if (it == g_dev.end() || it->second.fd < 0) return INVALID_VALUE;
  struct stat st;
  if (fstat(it->second.fd, &st) != 0) return INVALID_VALUE;
  memset(h, 0, sizeof *h);
  memcpy(h->magic, "GEARIPC", 8);
  h->pid = (uint64_t)getpid();
  h->fd = (uint64_t)it->second.fd;
  h->ino = (uint64_t)st.st_ino;
  h->size = it->second.size;
  return OK;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* p, IpcHandle h, unsigned int flags) {
  FAIL_POINT("cuIpcOpenMemHandle_v2");
  NEED_CONTEXT();
  if (flags != 1) return INVALID_VALUE;
  if (memcmp(h.magic, "GEARIPC", 8) != 0) return INVALID_VALUE;
  if (h.pid == (uint64_t)getpid()) return INVALID_CONTEXT;
  std::lock_guard<std::recursive_mutex> l(g_mu);
  for (auto& r : g_ipc) {
    struct stat st;
    if (fstat(r.second.fd, &st) == 0 && (uint64_t)st.st_ino == h.ino) {
      g_ipc_refs[r.first]++;
      *p = (CUdeviceptr)r.first;
      return OK;
    }
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/%llu/fd/%llu", (unsigned long long)h.pid, (unsigned long long)h.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return INVALID_VALUE;  // the exporter is gone
  struct stat st;
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_ino != h.ino || (uint64_t)st.st_size != h.size) {
    close(fd);
    return INVALID_VALUE;  // freed, and the fd number reused
  }
  void* m = mmap(nullptr, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    close(fd);
    return INVALID_VALUE;
  }
  g_ipc[(uintptr_t)m] = Region{h.size, 0, current(), fd};
  g_ipc_refs[(uintptr_t)m] = 1;
  *p = (CUdeviceptr)m;
  return OK;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  FAIL_POINT("cuIpcCloseMemHandle");
  NEED_CONTEXT();
  std::lock_guard<std::recursive_mutex> l(g_mu);
  auto it = g_ipc.find(p);
  if (it == g_ipc.end()) return INVALID_VALUE;
  if (--g_ipc_refs[p] > 0) return OK;
  g_ipc_refs.erase(p);
  release_region(it->first, it->second, true);
  g_ipc.erase(it);
  return OK;
}

// ---------------------------------------------------------------------------
// Test hooks.

int fakecuda_launches(void) {
  std::lock_guard<std::recursive_mutex> l(g_mu);
  return g_launches;
}

int fakecuda_last_launch(char* name, int cap, unsigned* dims, unsigned* shmem, uintptr_t* stream) {
  std::lock_guard<std::recursive_mutex> l(g_mu);
  snprintf(name, cap, "%s", g_last.name.c_str());
  memcpy(dims, g_last.dims, sizeof g_last.dims);
  *shmem = g_last.shmem;
  *stream = g_last.stream;
  return (int)g_last.params.size();
}

int fakecuda_last_param(int i, void* out, int cap) {
  std::lock_guard<std::recursive_mutex> l(g_mu);
  if (i < 0 || i >= (int)g_last.params.size()) return -1;
  const std::vector<unsigned char>& p = g_last.params[i];
  if ((int)p.size() <= cap) memcpy(out, p.data(), p.size());
  return (int)p.size();
}

// fakecuda_live counts what is alive: 0 device allocations, 1 host allocations,
// 2 registrations, 3 streams, 4 events, 5 modules, 6 primary context references,
// 7 objects destroyed with their context because they were not freed first.
int fakecuda_live(int kind) {
  std::lock_guard<std::recursive_mutex> l(g_mu);
  switch (kind) {
    case 0: return (int)g_dev.size();
    case 1: return (int)g_host.size();
    case 2: return (int)g_reg.size();
    case 3: return (int)g_streams.size();
    case 4: return (int)g_events.size();
    case 5: return (int)g_modules.size();
    case 6: {
      int n = 0;
      for (const Context& c : g_ctx) n += c.refs;
      return n;
    }
    case 7: return g_reclaimed;
    case 8: return (int)g_ipc.size();
  }
  return -1;
}

// fakecuda_host_flags returns the flags a host region at p was allocated or
// registered with, or -1.
int fakecuda_host_flags(void* p) {
  std::lock_guard<std::recursive_mutex> l(g_mu);
  auto r = g_reg.find((uintptr_t)p);
  if (r != g_reg.end()) return (int)r->second.flags;
  auto h = g_host.find((uintptr_t)p);
  if (h != g_host.end()) return (int)h->second.flags;
  return -1;
}

// fakecuda_fail makes the next `times` calls of fn return code.
void fakecuda_fail(const char* fn, int code, int times) {
  std::lock_guard<std::recursive_mutex> l(g_mu);
  g_fail_fn = fn;
  g_fail_code = code;
  g_fail_times = times;
}

// fakecuda_stream_hold keeps stream s busy (cuStreamQuery: not ready) while its
// holds are positive; the fake NCCL holds a stream while a collective waits for
// its peers.
int fakecuda_stream_hold(uintptr_t s, int delta) {
  std::lock_guard<std::recursive_mutex> l(g_mu);
  Stream* st = stream_of(s);
  if (!st) return INVALID_HANDLE;
  st->holds += delta;
  return OK;
}

}  // extern "C"
