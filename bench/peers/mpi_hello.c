/* The MPI counterpart of examples/hello, for launch-time comparisons
 * (bench/peers/launch_time.sh): every rank initialises MPI, prints its rank,
 * passes a barrier, and finalises. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int rank, size, len;
    char host[MPI_MAX_PROCESSOR_NAME];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(host, &len);
    printf("hello from rank %d of %d on %s\n", rank, size, host);
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        printf("world of %d ranks\n", size);
    }
    MPI_Finalize();
    return 0;
}
