/*
 * crosscore.c: what moving a buffer from one core's cache to another's costs
 * on this machine, beside an in-cache copy of the same bytes: the floor under
 * an np=2 shared-memory AllReduce's bus bandwidth against memcpy
 * (docs/benchmarks.md, "Against a copy of the same bytes").
 *
 * Two threads, pinned to CPUs 0 and 1, each own a buffer of SIZE bytes. Every
 * round both write their own buffer (as a rank's last write before the peer
 * reads it), meet at a barrier, then each reads the other's whole buffer and
 * adds it into a private one (what a reduction does with the peer's data),
 * and meet again. The read-and-add phase is timed; an AllReduce at np=2 must
 * bring at least the peer's SIZE bytes across in some such phase (recursive
 * doubling: all of them; reduce-scatter and allgather: half in each). The copy
 * line times memcpy of SIZE bytes between two buffers that stay in the
 * core's cache, as gearbench --memcpy does.
 *
 *   cc -O2 -pthread -o crosscore bench/peers/crosscore.c
 *   ./crosscore [SIZE ...]        # default 65536 1048576; medians of 2000 rounds
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ROUNDS 2000

static size_t size;
static char *buf[2];
static double *acc[2];
static double times[2][ROUNDS];
static _Atomic int arrived, released;

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* barrier: a sense-reversing barrier of the two spinning threads. */
static void barrier(int *sense) {
	*sense = !*sense;
	if (atomic_fetch_add(&arrived, 1) == 1) {
		atomic_store(&arrived, 0);
		atomic_store(&released, *sense);
	} else {
		while (atomic_load(&released) != *sense)
			;
	}
}

static void *run(void *arg) {
	int me = (int)(long)arg, sense = 0;
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(me, &set);
	pthread_setaffinity_np(pthread_self(), sizeof set, &set);
	size_t n = size / sizeof(double);
	for (int r = 0; r < ROUNDS; r++) {
		memset(buf[me], r & 0x7f, size);
		barrier(&sense);
		const double *peer = (const double *)buf[!me];
		double *a = acc[me], t0 = now();
		for (size_t i = 0; i < n; i++)
			a[i] += peer[i];
		times[me][r] = now() - t0;
		barrier(&sense);
	}
	return 0;
}

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n) {
	qsort(v, n, sizeof *v, cmp);
	return v[n / 2];
}

int main(int argc, char **argv) {
	const char *def[] = {"65536", "1048576"};
	int nsizes = argc > 1 ? argc - 1 : 2;
	for (int k = 0; k < nsizes; k++) {
		size = strtoul(argc > 1 ? argv[k + 1] : def[k], 0, 10);
		if (size < 64 || size % 64) {
			fprintf(stderr, "crosscore: size %zu: want a multiple of 64\n", size);
			return 2;
		}
		for (int i = 0; i < 2; i++) {
			buf[i] = aligned_alloc(64, size);
			acc[i] = aligned_alloc(64, size);
			memset(acc[i], 0, size);
		}
		pthread_t t[2];
		for (long i = 0; i < 2; i++)
			pthread_create(&t[i], 0, run, (void *)i);
		for (int i = 0; i < 2; i++)
			pthread_join(t[i], 0);
		double cross = median(times[0], ROUNDS);
		/* The in-cache copy, on one core. */
		char *src = buf[0], *dst = (char *)acc[0];
		double ct[ROUNDS];
		for (int r = 0; r < ROUNDS; r++) {
			double t0 = now();
			memcpy(dst, src, size);
			__asm__ volatile("" : : "r"(dst) : "memory");
			ct[r] = now() - t0;
		}
		double cp = median(ct, ROUNDS);
		printf("{\"bytes\":%zu,\"cross_core_read_add_s\":%.9f,\"cross_core_bytes_per_s\":%.4g,"
		       "\"memcpy_s\":%.9f,\"memcpy_bytes_per_s\":%.4g,\"ratio\":%.3f}\n",
		       size, cross, size / cross, cp, size / cp, cp / cross);
		for (int i = 0; i < 2; i++) {
			free(buf[i]);
			free(acc[i]);
		}
	}
	return 0;
}
