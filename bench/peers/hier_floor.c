/*
 * hier_floor.c: the least a hierarchical 8-byte AllReduce across two hosts can
 * cost on this machine, as a floor for gear's (bench/peers/netns_allreduce.sh).
 *
 * It does what gear's does and nothing else: the second rank of a host writes
 * its value into shared memory, the first adds it to its own, swaps the sum
 * with the first rank of the other host over TCP (TCP_NODELAY, non-blocking),
 * and writes the total back into shared memory. Every wait polls and calls
 * sched_yield between polls, as gear's waits do when a machine has more ranks
 * than cores. "loop" is the reference: two processes, one per core, swapping 8
 * bytes over loopback TCP and spinning on the socket, as gearbench's np=2 does.
 *
 *   hier_floor leader A|B ADDR PORT ITERS SHM   first rank of host A (listens
 *                                               on ADDR:PORT) or B (dials it)
 *   hier_floor member A|B ITERS SHM             second rank of that host
 *   hier_floor loop ITERS                       the np=2 loopback reference
 *
 * SHM names the shared-memory file of the host (under /dev/shm), which the
 * leader creates and the member opens. The leader of host A and "loop" print
 * one line like gearbench --json: the mean seconds per call over the last 90%
 * of ITERS calls.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct host {
	_Atomic long contrib_seq;
	double contrib;
	char pad[48]; /* the two directions on their own cache lines */
	_Atomic long result_seq;
	double result;
};

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what) {
	perror(what);
	exit(1);
}

static struct host *open_host(const char *name, int create) {
	char path[256];
	snprintf(path, sizeof path, "/dev/shm/%s", name);
	int fd = -1;
	for (int i = 0; i < 5000 && fd < 0; i++) { /* the member waits for the leader */
		fd = open(path, O_RDWR | (create ? O_CREAT : 0), 0600);
		if (fd < 0)
			usleep(1000);
	}
	if (fd < 0)
		die(path);
	if (create && ftruncate(fd, 4096) != 0)
		die("ftruncate");
	struct host *h = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (h == MAP_FAILED)
		die("mmap");
	close(fd);
	return h;
}

static int tcp_pair(int listen_side, const char *addr, int port) {
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (inet_pton(AF_INET, addr, &a.sin_addr) != 1) {
		fprintf(stderr, "hier_floor: bad address %s\n", addr);
		exit(2);
	}
	int one = 1, s;
	if (listen_side) {
		int l = socket(AF_INET, SOCK_STREAM, 0);
		setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(l, (void *)&a, sizeof a) != 0)
			die("bind");
		listen(l, 1);
		s = accept(l, 0, 0);
		close(l);
	} else {
		for (int i = 0;; i++) {
			s = socket(AF_INET, SOCK_STREAM, 0);
			if (connect(s, (void *)&a, sizeof a) == 0)
				break;
			close(s);
			if (i == 5000)
				die("connect");
			usleep(1000);
		}
	}
	if (s < 0)
		die("accept");
	setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	fcntl(s, F_SETFL, O_NONBLOCK);
	return s;
}

/* swap writes 8 bytes and reads the peer's 8, calling idle between polls. */
static double swap(int s, double mine, void (*idle)(void)) {
	if (write(s, &mine, 8) != 8)
		die("write");
	double theirs;
	size_t got = 0;
	while (got < 8) {
		ssize_t n = read(s, (char *)&theirs + got, 8 - got);
		if (n > 0)
			got += n;
		else if (n < 0 && errno == EAGAIN)
			idle();
		else
			die("read");
	}
	return theirs;
}

static void yield(void) { sched_yield(); }
static void spin(void) {}

static void report(double seconds) {
	printf("{\"op\":\"allreduce\",\"bytes\":8,\"seconds\":%.12f}\n", seconds);
}

int main(int argc, char **argv) {
	if (argc >= 7 && strcmp(argv[1], "leader") == 0) {
		int a = argv[2][0] == 'A';
		long iters = atol(argv[5]);
		struct host *h = open_host(argv[6], 1);
		int s = tcp_pair(a, argv[3], atoi(argv[4]));
		double t0 = now();
		for (long i = 1; i <= iters; i++) {
			if (i == iters / 10 + 1)
				t0 = now();
			while (atomic_load(&h->contrib_seq) != i)
				sched_yield();
			double sum = 1 + h->contrib;
			h->result = sum + swap(s, sum, yield);
			atomic_store(&h->result_seq, i);
		}
		if (a)
			report((now() - t0) / (iters - iters / 10));
		return 0;
	}
	if (argc >= 5 && strcmp(argv[1], "member") == 0) {
		long iters = atol(argv[3]);
		struct host *h = open_host(argv[4], 0);
		for (long i = 1; i <= iters; i++) {
			h->contrib = 2;
			atomic_store(&h->contrib_seq, i);
			while (atomic_load(&h->result_seq) != i)
				sched_yield();
			if (h->result != 6) {
				fprintf(stderr, "hier_floor: call %ld: result %g, want 6\n", i, h->result);
				return 1;
			}
		}
		return 0;
	}
	if (argc >= 3 && strcmp(argv[1], "loop") == 0) {
		long iters = atol(argv[2]);
		int l = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in a = {.sin_family = AF_INET};
		inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
		socklen_t al = sizeof a;
		if (bind(l, (void *)&a, sizeof a) != 0 || listen(l, 1) != 0 || getsockname(l, (void *)&a, &al) != 0)
			die("listen");
		pid_t child = fork();
		int me = child == 0;
		cpu_set_t cpus;
		CPU_ZERO(&cpus);
		CPU_SET(me % sysconf(_SC_NPROCESSORS_ONLN), &cpus);
		sched_setaffinity(0, sizeof cpus, &cpus);
		int s;
		if (me) {
			s = socket(AF_INET, SOCK_STREAM, 0);
			if (connect(s, (void *)&a, sizeof a) != 0)
				die("connect");
		} else {
			s = accept(l, 0, 0);
		}
		close(l);
		int one = 1;
		setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		fcntl(s, F_SETFL, O_NONBLOCK);
		double t0 = now();
		for (long i = 1; i <= iters; i++) {
			if (i == iters / 10 + 1)
				t0 = now();
			if (swap(s, me + 1, spin) != 2 - me) {
				fprintf(stderr, "hier_floor: loop: wrong value\n");
				return 1;
			}
		}
		if (me)
			return 0;
		report((now() - t0) / (iters - iters / 10));
		int status;
		waitpid(child, &status, 0);
		return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
	}
	fprintf(stderr, "usage: hier_floor leader A|B ADDR PORT ITERS SHM | member A|B ITERS SHM | loop ITERS\n");
	return 2;
}
