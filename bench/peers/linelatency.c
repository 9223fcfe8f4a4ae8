/*
 * linelatency.c: how long one cache line takes to move from one core to the
 * other on this machine. Two threads, pinned to CPUs 0 and 1, hand a counter
 * back and forth; each hand-over is one line moved. gear's processes meet on
 * a few shared lines per row inserted (the commit log's tail and cells, the
 * row's status, the free queue), so the writers' ratio of python/bench.py
 * moves with this figure while the numpy peer, which shares nothing, does
 * not (docs/benchmarks.md, "Rows given back in row order").
 *
 *   cc -O2 -pthread -o linelatency bench/peers/linelatency.c
 *   ./linelatency [ROUNDS]        # default 2000000 hand-overs each way
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static _Atomic long word __attribute__((aligned(64)));
static long rounds = 2000000;

static void pin(int cpu) {
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
		fprintf(stderr, "linelatency: cannot pin to CPU %d\n", cpu);
		exit(1);
	}
}

static void *answer(void *arg) {
	(void)arg;
	pin(1);
	for (long i = 0; i < rounds; i++) {
		while (atomic_load_explicit(&word, memory_order_acquire) != 2 * i + 1)
			;
		atomic_store_explicit(&word, 2 * i + 2, memory_order_release);
	}
	return NULL;
}

int main(int argc, char **argv) {
	if (argc > 1 && (rounds = atol(argv[1])) <= 0) {
		fprintf(stderr, "linelatency: rounds %s: want a positive count\n", argv[1]);
		return 2;
	}
	pin(0);
	pthread_t t;
	pthread_create(&t, NULL, answer, NULL);
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < rounds; i++) {
		atomic_store_explicit(&word, 2 * i + 1, memory_order_release);
		while (atomic_load_explicit(&word, memory_order_acquire) != 2 * i + 2)
			;
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	pthread_join(t, NULL);
	double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / rounds / 2;
	printf("one cache line from CPU 0 to CPU 1 or back: %.1f ns\n", ns);
	return 0;
}
