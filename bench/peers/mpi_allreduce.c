/*
 * mpi_allreduce: MPI_Allreduce (float32, sum) timed the way `gearbench allreduce`
 * times gear's AllReduce, printing the same lines, so that the two can be compared
 * run for run.
 *
 *   mpirun -np 2 ./mpi_allreduce --sizes 8,1K,64K,1M,16M,64M [--iters K] [--json]
 *
 * For every size: a warm-up, then --iters repetitions of a batch of calls (about
 * 4 MiB of payload, 1 to 1000 calls, so that small sizes are not lost in timer
 * resolution), each between two barriers; the time per call of a repetition is the
 * batch's time on rank 0, closing barrier included, divided by its length, and the
 * line reports the median over repetitions. The result of the first and last call of every
 * size is checked on every rank. algbw = bytes/seconds; busbw = algbw * 2(n-1)/n
 * (the nccl-tests formulae).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>
#include <math.h>

static long parse_size(const char *s) {
	char *end;
	long n = strtol(s, &end, 10);
	if (end == s || n < 0) return -1;
	char u[8] = {0};
	int i = 0;
	while (*end && i < 7) u[i++] = (char)toupper((unsigned char)*end++);
	if (!strcmp(u, "") || !strcmp(u, "B")) return n;
	if (!strcmp(u, "K") || !strcmp(u, "KB") || !strcmp(u, "KIB")) return n << 10;
	if (!strcmp(u, "M") || !strcmp(u, "MB") || !strcmp(u, "MIB")) return n << 20;
	if (!strcmp(u, "G") || !strcmp(u, "GB") || !strcmp(u, "GIB")) return n << 30;
	return -1;
}

static int cmp_double(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static long batch_len(long bytes) {
	/* about 4 MiB of payload per batch, between 1 and 1000 calls */
	long b = bytes > 0 ? (4L << 20) / bytes : 1000;
	if (b < 1) b = 1;
	if (b > 1000) b = 1000;
	return b;
}

static int check(const float *buf, long count, int np, int rank, long size) {
	/* rank r contributes (r+1) + (i%7): the sum is np(np+1)/2 + np*(i%7) */
	for (long i = 0; i < count; i++) {
		float want = (float)(np * (np + 1) / 2 + np * (int)(i % 7));
		if (buf[i] != want) {
			fprintf(stderr, "mpi_allreduce: rank %d size %ld: element %ld is %g, want %g\n",
			        rank, size, i, buf[i], want);
			return 0;
		}
	}
	return 1;
}

static void fill(float *buf, long count, int rank) {
	for (long i = 0; i < count; i++) buf[i] = (float)(rank + 1 + (int)(i % 7));
}

int main(int argc, char **argv) {
	MPI_Init(&argc, &argv);
	int rank, np;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &np);

	const char *sizes = "8,1K,64K,1M,16M,64M";
	int iters = 20, json = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--sizes") && i + 1 < argc) sizes = argv[++i];
		else if (!strncmp(argv[i], "--sizes=", 8)) sizes = argv[i] + 8;
		else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
		else if (!strncmp(argv[i], "--iters=", 8)) iters = atoi(argv[i] + 8);
		else if (!strcmp(argv[i], "--json")) json = 1;
		else {
			if (rank == 0) fprintf(stderr, "usage: mpi_allreduce [--sizes LIST] [--iters K] [--json]\n");
			MPI_Finalize();
			return 2;
		}
	}
	if (iters < 1) iters = 1;

	char *list = strdup(sizes);
	double *times = malloc(sizeof(double) * (size_t)iters);
	int ok = 1;
	for (char *tok = strtok(list, ","); tok && ok; tok = strtok(NULL, ",")) {
		long bytes = parse_size(tok);
		if (bytes < 0) {
			if (rank == 0) fprintf(stderr, "mpi_allreduce: bad size %s\n", tok);
			ok = 0;
			break;
		}
		long count = bytes / 4;
		bytes = count * 4;
		float *buf = malloc((size_t)(count > 0 ? count : 1) * sizeof(float));
		long batch = batch_len(bytes);

		/* warm-up and check */
		fill(buf, count, rank);
		MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		ok = check(buf, count, np, rank, bytes);
		for (long w = 1; w < batch && w < 10; w++)
			MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);

		for (int it = 0; it < iters; it++) {
			MPI_Barrier(MPI_COMM_WORLD);
			double t0 = MPI_Wtime();
			for (long b = 0; b < batch; b++)
				MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
			MPI_Barrier(MPI_COMM_WORLD);
			times[it] = (MPI_Wtime() - t0) / (double)batch;
		}
		fill(buf, count, rank);
		MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		ok = ok && check(buf, count, np, rank, bytes);
		int all_ok;
		MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
		ok = all_ok;
		free(buf);
		if (!ok) break;

		qsort(times, (size_t)iters, sizeof(double), cmp_double);
		double sec = iters % 2 ? times[iters / 2] : (times[iters / 2 - 1] + times[iters / 2]) / 2;
		double algbw = sec > 0 ? (double)bytes / sec : 0;
		double busbw = algbw * 2.0 * (np - 1) / np;
		if (rank == 0) {
			if (json)
				printf("{\"op\":\"allreduce\",\"np\":%d,\"bytes\":%ld,\"seconds\":%.6g,\"algbw\":%.6g,\"busbw\":%.6g,\"impl\":\"openmpi\"}\n",
				       np, bytes, sec, algbw, busbw);
			else
				printf("op=allreduce  np=%d  bytes=%ld  seconds=%.3gs  algbw=%.2fGB/s  busbw=%.2fGB/s\n",
				       np, bytes, sec, algbw / 1e9, busbw / 1e9);
			fflush(stdout);
		}
	}
	free(times);
	free(list);
	MPI_Finalize();
	return ok ? 0 : 1;
}
