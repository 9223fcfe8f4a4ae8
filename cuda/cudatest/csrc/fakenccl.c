// fakenccl.c: a fake libnccl.so.2 for gear's tests on machines without a GPU.
//
// Communicators of one unique ID meet in this process (one goroutine per rank):
// a collective or a send/recv is matched with its peers' calls and carried out
// on host memory (the fake libcuda's "device" memory), and until then it holds
// the caller's stream busy through fakecuda_stream_hold, as a real NCCL kernel
// would. Non-blocking communicators (ncclCommInitRankConfig with blocking = 0)
// report ncclInProgress while they wait for their peers and once after every
// call, so the caller's polling is exercised. ncclCommAbort releases the
// aborted rank's pending work and tells its peers ncclRemoteError. Calls on an
// aborted or destroyed communicator are counted as misuse.
//
// Built with -DFAKE_NO_CONFIG it lacks ncclCommInitRankConfig and
// ncclCommFinalize, like NCCL before 2.14.

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  char internal[128];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
} config_v21400;

#define MAXR 16
#define MAXOPS 64
#define MAXQ 64
#define INT_MIN_ (-2147483647 - 1)

enum { OP_ALLREDUCE, OP_BROADCAST, OP_REDUCE, OP_ALLGATHER, OP_REDUCESCATTER, OP_SEND, OP_RECV };

typedef struct {
  int kind;
  const void* send;
  void* recv;
  size_t count;
  int dtype, redop, root, peer;
  uintptr_t stream;
} op_t;

struct group;

typedef struct comm {
  struct group* g;
  int rank;
  int blocking;
  int init_done;
  int dead;  // aborted or destroyed
  int remote_error;
  int pending_polls;  // ncclInProgress answers still to give
  unsigned long coll_seq;
} comm_t;

typedef struct {
  unsigned long seq;
  int arrived;
  int present[MAXR];
  op_t ops[MAXR];
} slot_t;

typedef struct {
  op_t q[MAXQ];
  int head, tail;
} queue_t;

typedef struct group {
  ncclUniqueId id;
  int nranks;
  int joined;
  comm_t* ranks[MAXR];
  slot_t coll[MAXOPS];
  queue_t sendq[MAXR][MAXR];  // [src][dst]
  queue_t recvq[MAXR][MAXR];  // [dst][src]
  struct group* next;
} group_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static group_t* groups;
static unsigned char last_id[128];
static int last_nranks = -1, last_rank = -1, last_blocking = -1, last_kind = -1;
static unsigned last_cfg_version;
static size_t last_cfg_size;
static int n_aborts, n_misuse, n_live, n_destroys, n_finalizes, n_ids;
static unsigned id_counter;
static char last_error[256];
static __thread int group_depth;
static __thread comm_t* group_comms[MAXR];
static __thread int group_ncomms;

// hold keeps a stream of the fake libcuda.so.1 beside this library busy. The
// sibling is found by path, so that variants built into other directories and
// loaded in the same process do not mix.
static int hold(uintptr_t stream, int delta) {
  static int (*fn)(uintptr_t, int);
  static int looked;
  if (!looked) {
    Dl_info info;
    if (dladdr((void*)&hold, &info) && info.dli_fname) {
      char path[4096];
      snprintf(path, sizeof path, "%s", info.dli_fname);
      char* slash = strrchr(path, '/');
      if (slash) {
        snprintf(slash + 1, sizeof path - (slash + 1 - path), "libcuda.so.1");
        void* h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
        if (h) fn = (int (*)(uintptr_t, int))dlsym(h, "fakecuda_stream_hold");
      }
    }
    if (!fn) fn = (int (*)(uintptr_t, int))dlsym(RTLD_DEFAULT, "fakecuda_stream_hold");
    looked = fn != NULL;
  }
  return fn ? fn(stream, delta) : 0;
}

static size_t dsize(int dt) {
  switch (dt) {
    case 0: case 1: return 1;
    case 6: case 9: return 2;
    case 2: case 3: case 7: return 4;
    case 4: case 5: case 8: return 8;
  }
  return 0;
}

#define REDUCE(T)                                                    \
  {                                                                  \
    T* a = (T*)acc;                                                  \
    const T* b = (const T*)x;                                        \
    for (size_t i = 0; i < n; i++) {                                 \
      switch (op) {                                                  \
        case 0: case 4: a[i] = a[i] + b[i]; break;                   \
        case 1: a[i] = a[i] * b[i]; break;                           \
        case 2: a[i] = a[i] > b[i] ? a[i] : b[i]; break;             \
        case 3: a[i] = a[i] < b[i] ? a[i] : b[i]; break;             \
      }                                                              \
    }                                                                \
  }                                                                  \
  break;

#define AVG(T)                                  \
  {                                             \
    T* a = (T*)acc;                             \
    for (size_t i = 0; i < n; i++) a[i] /= (T)k; \
  }                                             \
  break;

static int reduce_into(void* acc, const void* x, size_t n, int dt, int op) {
  if (op < 0 || op > 4) return 0;
  switch (dt) {
    case 0: REDUCE(int8_t)
    case 1: REDUCE(uint8_t)
    case 2: REDUCE(int32_t)
    case 3: REDUCE(uint32_t)
    case 4: REDUCE(int64_t)
    case 5: REDUCE(uint64_t)
    case 7: REDUCE(float)
    case 8: REDUCE(double)
    default: return 0;
  }
  return 1;
}

static void average(void* acc, size_t n, int dt, int k) {
  switch (dt) {
    case 0: AVG(int8_t)
    case 1: AVG(uint8_t)
    case 2: AVG(int32_t)
    case 3: AVG(uint32_t)
    case 4: AVG(int64_t)
    case 5: AVG(uint64_t)
    case 7: AVG(float)
    case 8: AVG(double)
  }
}

static void set_error(const char* msg) { snprintf(last_error, sizeof last_error, "fake NCCL: %s", msg); }

// flag_remote marks every live rank of g (except skip) with a remote error.
static void flag_remote(group_t* g, comm_t* skip) {
  for (int r = 0; r < g->nranks; r++) {
    if (g->ranks[r] && g->ranks[r] != skip && !g->ranks[r]->dead) g->ranks[r]->remote_error = 1;
  }
}

// execute carries out a complete collective slot; 0 on a mismatch.
static int execute(group_t* g, slot_t* s) {
  const int n = g->nranks;
  const op_t* o0 = &s->ops[0];
  for (int r = 1; r < n; r++) {
    const op_t* o = &s->ops[r];
    if (o->kind != o0->kind || o->count != o0->count || o->dtype != o0->dtype ||
        o->redop != o0->redop || o->root != o0->root) {
      return 0;
    }
  }
  const size_t sz = dsize(o0->dtype);
  const size_t bytes = o0->count * sz;
  if (sz == 0) return 0;
  switch (o0->kind) {
    case OP_ALLREDUCE:
    case OP_REDUCE: {
      void* tmp = malloc(bytes ? bytes : 1);
      memcpy(tmp, o0->send, bytes);
      for (int r = 1; r < n; r++) {
        if (!reduce_into(tmp, s->ops[r].send, o0->count, o0->dtype, o0->redop)) {
          free(tmp);
          return 0;
        }
      }
      if (o0->redop == 4) average(tmp, o0->count, o0->dtype, n);
      for (int r = 0; r < n; r++) {
        if (o0->kind == OP_ALLREDUCE || r == o0->root) memcpy(s->ops[r].recv, tmp, bytes);
      }
      free(tmp);
      return 1;
    }
    case OP_BROADCAST: {
      if (o0->root < 0 || o0->root >= n) return 0;
      void* tmp = malloc(bytes ? bytes : 1);
      memcpy(tmp, s->ops[o0->root].send, bytes);
      for (int r = 0; r < n; r++) memcpy(s->ops[r].recv, tmp, bytes);
      free(tmp);
      return 1;
    }
    case OP_ALLGATHER: {
      char* tmp = malloc(bytes * n + 1);
      for (int r = 0; r < n; r++) memcpy(tmp + r * bytes, s->ops[r].send, bytes);
      for (int r = 0; r < n; r++) memcpy(s->ops[r].recv, tmp, bytes * n);
      free(tmp);
      return 1;
    }
    case OP_REDUCESCATTER: {
      char* tmp = malloc(bytes * n + 1);
      memcpy(tmp, o0->send, bytes * n);
      for (int r = 1; r < n; r++) {
        if (!reduce_into(tmp, s->ops[r].send, o0->count * n, o0->dtype, o0->redop)) {
          free(tmp);
          return 0;
        }
      }
      if (o0->redop == 4) average(tmp, o0->count * n, o0->dtype, n);
      for (int r = 0; r < n; r++) memcpy(s->ops[r].recv, tmp + r * bytes, bytes);
      free(tmp);
      return 1;
    }
  }
  return 0;
}

static int usable(comm_t* c) {
  if (c == NULL || c->dead) {
    n_misuse++;
    set_error("call on an aborted or destroyed communicator");
    return 0;
  }
  return 1;
}

// after_call is what a call returns on success: ncclInProgress once for a
// non-blocking communicator (outside a group), ncclSuccess otherwise.
static ncclResult_t after_call(comm_t* c) {
  if (group_depth > 0) {
    int seen = 0;
    for (int i = 0; i < group_ncomms; i++) seen |= group_comms[i] == c;
    if (!seen && group_ncomms < MAXR) group_comms[group_ncomms++] = c;
    return ncclSuccess;
  }
  if (!c->blocking) {
    c->pending_polls = 1;
    return ncclInProgress;
  }
  return ncclSuccess;
}

static ncclResult_t enqueue_coll(comm_t* c, op_t op) {
  pthread_mutex_lock(&mu);
  if (!usable(c)) {
    pthread_mutex_unlock(&mu);
    return ncclInvalidUsage;
  }
  group_t* g = c->g;
  if (g->joined < g->nranks) {
    set_error("collective before the communicator is initialised");
    pthread_mutex_unlock(&mu);
    return ncclInvalidUsage;
  }
  if (dsize(op.dtype) == 0 || op.redop < 0 || op.redop > 4) {
    set_error("unsupported data type or reduction");
    pthread_mutex_unlock(&mu);
    return ncclInvalidArgument;
  }
  unsigned long seq = c->coll_seq++;
  slot_t* s = &g->coll[seq % MAXOPS];
  if (s->arrived > 0 && s->seq != seq) {
    set_error("too many collectives in flight");
    pthread_mutex_unlock(&mu);
    return ncclInternalError;
  }
  s->seq = seq;
  s->ops[c->rank] = op;
  s->present[c->rank] = 1;
  s->arrived++;
  hold(op.stream, +1);
  if (s->arrived == g->nranks) {
    if (!execute(g, s)) {
      set_error("mismatched collective");
      for (int r = 0; r < g->nranks; r++) {
        if (g->ranks[r]) g->ranks[r]->remote_error = 1;
      }
    }
    for (int r = 0; r < g->nranks; r++) {
      if (s->present[r]) hold(s->ops[r].stream, -1);
      s->present[r] = 0;
    }
    s->arrived = 0;
  }
  ncclResult_t res = after_call(c);
  pthread_mutex_unlock(&mu);
  return res;
}

static void match_p2p(group_t* g, int src, int dst) {
  queue_t* sq = &g->sendq[src][dst];
  queue_t* rq = &g->recvq[dst][src];
  while (sq->head < sq->tail && rq->head < rq->tail) {
    op_t* so = &sq->q[sq->head % MAXQ];
    op_t* ro = &rq->q[rq->head % MAXQ];
    size_t sb = so->count * dsize(so->dtype), rb = ro->count * dsize(ro->dtype);
    if (sb != rb) {
      set_error("send and receive sizes differ");
      flag_remote(g, NULL);
      if (g->ranks[src]) g->ranks[src]->remote_error = 1;
      if (g->ranks[dst]) g->ranks[dst]->remote_error = 1;
    } else {
      memcpy(ro->recv, so->send, sb);
    }
    hold(so->stream, -1);
    hold(ro->stream, -1);
    sq->head++;
    rq->head++;
  }
}

static ncclResult_t enqueue_p2p(comm_t* c, op_t op) {
  pthread_mutex_lock(&mu);
  if (!usable(c)) {
    pthread_mutex_unlock(&mu);
    return ncclInvalidUsage;
  }
  group_t* g = c->g;
  if (op.peer < 0 || op.peer >= g->nranks || dsize(op.dtype) == 0) {
    set_error("bad peer or data type");
    pthread_mutex_unlock(&mu);
    return ncclInvalidArgument;
  }
  queue_t* q = op.kind == OP_SEND ? &g->sendq[c->rank][op.peer] : &g->recvq[c->rank][op.peer];
  if (q->tail - q->head >= MAXQ) {
    set_error("too many sends or receives in flight");
    pthread_mutex_unlock(&mu);
    return ncclInternalError;
  }
  q->q[q->tail++ % MAXQ] = op;
  hold(op.stream, +1);
  if (op.kind == OP_SEND) {
    match_p2p(g, c->rank, op.peer);
  } else {
    match_p2p(g, op.peer, c->rank);
  }
  ncclResult_t res = after_call(c);
  pthread_mutex_unlock(&mu);
  return res;
}

// release_rank drops the pending work of rank r (its holds end, as its kernels
// would on abort).
static void release_rank(group_t* g, int r) {
  for (int i = 0; i < MAXOPS; i++) {
    slot_t* s = &g->coll[i];
    if (s->arrived > 0 && s->present[r]) {
      hold(s->ops[r].stream, -1);
      s->present[r] = 0;
      s->arrived--;
    }
  }
  for (int p = 0; p < g->nranks; p++) {
    queue_t* qs[2] = {&g->sendq[r][p], &g->recvq[r][p]};
    for (int k = 0; k < 2; k++) {
      while (qs[k]->head < qs[k]->tail) {
        hold(qs[k]->q[qs[k]->head % MAXQ].stream, -1);
        qs[k]->head++;
      }
    }
  }
}

static group_t* find_group(const ncclUniqueId* id, int nranks) {
  for (group_t* g = groups; g; g = g->next) {
    if (memcmp(&g->id, id, sizeof *id) == 0) return g;
  }
  group_t* g = calloc(1, sizeof *g);
  g->id = *id;
  g->nranks = nranks;
  g->next = groups;
  groups = g;
  return g;
}

static ncclResult_t init_rank(comm_t** out, int nranks, const ncclUniqueId* id, int rank, int blocking) {
  if (nranks < 1 || nranks > MAXR || rank < 0 || rank >= nranks) {
    set_error("bad rank or size");
    return ncclInvalidArgument;
  }
  pthread_mutex_lock(&mu);
  group_t* g = find_group(id, nranks);
  if (g->nranks != nranks || g->ranks[rank] != NULL) {
    set_error("rank joined twice or sizes differ");
    pthread_mutex_unlock(&mu);
    return ncclInvalidUsage;
  }
  comm_t* c = calloc(1, sizeof *c);
  c->g = g;
  c->rank = rank;
  c->blocking = blocking;
  g->ranks[rank] = c;
  g->joined++;
  n_live++;
  *out = c;
  pthread_cond_broadcast(&cv);
  if (!blocking) {
    pthread_mutex_unlock(&mu);
    return ncclInProgress;
  }
  const char* t = getenv("FAKE_NCCL_INIT_TIMEOUT_MS");
  long ms = t ? atol(t) : 10000;
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += ms / 1000;
  deadline.tv_nsec += (ms % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec++;
    deadline.tv_nsec -= 1000000000L;
  }
  while (g->joined < g->nranks) {
    if (pthread_cond_timedwait(&cv, &mu, &deadline) != 0) {
      set_error("timed out waiting for peers");
      pthread_mutex_unlock(&mu);
      return ncclSystemError;
    }
  }
  c->init_done = 1;
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

static void record_init(const ncclUniqueId* id, int nranks, int rank, int kind) {
  pthread_mutex_lock(&mu);
  memcpy(last_id, id, sizeof last_id);
  last_nranks = nranks;
  last_rank = rank;
  last_kind = kind;
  pthread_mutex_unlock(&mu);
}

ncclResult_t ncclGetVersion(int* v) {
  *v = 22703;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  pthread_mutex_lock(&mu);
  unsigned k = ++id_counter;
  n_ids++;
  pthread_mutex_unlock(&mu);
  for (int i = 0; i < 128; i++) id->internal[i] = (char)((i * 37 + k * 101 + 7) & 0xff);
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

const char* ncclGetLastError(comm_t* c) {
  (void)c;
  return last_error;
}

ncclResult_t ncclCommInitRank(comm_t** comm, int nranks, ncclUniqueId id, int rank) {
  record_init(&id, nranks, rank, 0);
  return init_rank(comm, nranks, &id, rank, 1);
}

#ifndef FAKE_NO_CONFIG
ncclResult_t ncclCommInitRankConfig(comm_t** comm, int nranks, ncclUniqueId id, int rank,
                                    config_v21400* cfg) {
  record_init(&id, nranks, rank, 1);
  int blocking = 1;
  if (cfg != NULL) {
    pthread_mutex_lock(&mu);
    last_cfg_size = cfg->size;
    last_cfg_version = cfg->version;
    last_blocking = cfg->blocking;
    pthread_mutex_unlock(&mu);
    if (cfg->magic != 0xcafebeef || cfg->size < sizeof(config_v21400) || cfg->version < 21400) {
      set_error("bad config");
      return ncclInvalidArgument;
    }
    if (cfg->blocking != INT_MIN_) blocking = cfg->blocking;
  }
  return init_rank(comm, nranks, &id, rank, blocking);
}

ncclResult_t ncclCommFinalize(comm_t* c) {
  pthread_mutex_lock(&mu);
  if (!usable(c)) {
    pthread_mutex_unlock(&mu);
    return ncclInvalidUsage;
  }
  n_finalizes++;
  ncclResult_t r = after_call(c);
  pthread_mutex_unlock(&mu);
  return r;
}
#endif

ncclResult_t ncclCommGetAsyncError(comm_t* c, ncclResult_t* res) {
  pthread_mutex_lock(&mu);
  if (!usable(c)) {
    pthread_mutex_unlock(&mu);
    return ncclInvalidUsage;
  }
  if (!c->init_done) {
    if (c->g->joined == c->g->nranks) {
      c->init_done = 1;
    } else {
      *res = ncclInProgress;
      pthread_mutex_unlock(&mu);
      return ncclSuccess;
    }
  }
  if (c->remote_error) {
    *res = ncclRemoteError;
  } else if (c->pending_polls > 0) {
    c->pending_polls--;
    *res = ncclInProgress;
  } else {
    *res = ncclSuccess;
  }
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(comm_t* c) {
  if (c == NULL) return ncclSuccess;
  pthread_mutex_lock(&mu);
  if (!usable(c)) {
    pthread_mutex_unlock(&mu);
    return ncclInvalidUsage;
  }
  n_aborts++;
  c->dead = 1;
  n_live--;
  release_rank(c->g, c->rank);
  flag_remote(c->g, c);
  c->g->ranks[c->rank] = NULL;
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(comm_t* c) {
  if (c == NULL) return ncclSuccess;
  pthread_mutex_lock(&mu);
  if (!usable(c)) {
    pthread_mutex_unlock(&mu);
    return ncclInvalidUsage;
  }
  n_destroys++;
  c->dead = 1;
  n_live--;
  release_rank(c->g, c->rank);
  c->g->ranks[c->rank] = NULL;
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

ncclResult_t ncclCommCount(comm_t* c, int* n) {
  if (!c) return ncclInvalidArgument;
  *n = c->g->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(comm_t* c, int* r) {
  if (!c) return ncclInvalidArgument;
  *r = c->rank;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, int dt, int op, comm_t* c,
                           uintptr_t st) {
  op_t o = {OP_ALLREDUCE, s, r, n, dt, op, 0, 0, st};
  return enqueue_coll(c, o);
}

ncclResult_t ncclBroadcast(const void* s, void* r, size_t n, int dt, int root, comm_t* c,
                           uintptr_t st) {
  op_t o = {OP_BROADCAST, s, r, n, dt, 0, root, 0, st};
  return enqueue_coll(c, o);
}

ncclResult_t ncclReduce(const void* s, void* r, size_t n, int dt, int op, int root, comm_t* c,
                        uintptr_t st) {
  op_t o = {OP_REDUCE, s, r, n, dt, op, root, 0, st};
  return enqueue_coll(c, o);
}

ncclResult_t ncclAllGather(const void* s, void* r, size_t n, int dt, comm_t* c, uintptr_t st) {
  op_t o = {OP_ALLGATHER, s, r, n, dt, 0, 0, 0, st};
  return enqueue_coll(c, o);
}

ncclResult_t ncclReduceScatter(const void* s, void* r, size_t n, int dt, int op, comm_t* c,
                               uintptr_t st) {
  op_t o = {OP_REDUCESCATTER, s, r, n, dt, op, 0, 0, st};
  return enqueue_coll(c, o);
}

ncclResult_t ncclSend(const void* s, size_t n, int dt, int peer, comm_t* c, uintptr_t st) {
  op_t o = {OP_SEND, s, NULL, n, dt, 0, 0, peer, st};
  return enqueue_p2p(c, o);
}

ncclResult_t ncclRecv(void* r, size_t n, int dt, int peer, comm_t* c, uintptr_t st) {
  op_t o = {OP_RECV, NULL, r, n, dt, 0, 0, peer, st};
  return enqueue_p2p(c, o);
}

ncclResult_t ncclGroupStart(void) {
  if (group_depth++ == 0) group_ncomms = 0;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (group_depth <= 0) return ncclInvalidUsage;
  if (--group_depth > 0) return ncclSuccess;
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < group_ncomms; i++) {
    comm_t* c = group_comms[i];
    if (!c->dead && !c->blocking) {
      c->pending_polls = 1;
      res = ncclInProgress;
    }
  }
  group_ncomms = 0;
  pthread_mutex_unlock(&mu);
  return res;
}

// ---------------------------------------------------------------------------
// Test hooks.

// fakenccl_last_init copies what the last ncclCommInitRank(Config) received and
// returns 0 (plain init), 1 (config) or -1 (none yet).
int fakenccl_last_init(unsigned char* id, int* nranks, int* rank, int* blocking,
                       unsigned* cfg_version, size_t* cfg_size) {
  pthread_mutex_lock(&mu);
  memcpy(id, last_id, sizeof last_id);
  *nranks = last_nranks;
  *rank = last_rank;
  *blocking = last_blocking;
  *cfg_version = last_cfg_version;
  *cfg_size = last_cfg_size;
  int k = last_kind;
  pthread_mutex_unlock(&mu);
  return k;
}

// fakenccl_count: 0 aborts, 1 misuse, 2 live communicators, 3 destroys,
// 4 finalizes, 5 unique IDs made.
int fakenccl_count(int what) {
  pthread_mutex_lock(&mu);
  int v = -1;
  switch (what) {
    case 0: v = n_aborts; break;
    case 1: v = n_misuse; break;
    case 2: v = n_live; break;
    case 3: v = n_destroys; break;
    case 4: v = n_finalizes; break;
    case 5: v = n_ids; break;
  }
  pthread_mutex_unlock(&mu);
  return v;
}
