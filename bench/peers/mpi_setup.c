/* The MPI counterpart of `gearbench setup`, for setup-time comparisons
 * (bench/peers/setup.sh): every rank initialises MPI (rendezvous and the
 * communicator), runs one 8-byte MPI_Allreduce (checked), and finalises; rank 0
 * prints the sum. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double v = rank + 1, sum = 0;
    MPI_Allreduce(&v, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (sum != (double)size * (size + 1) / 2) {
        fprintf(stderr, "mpi_setup: rank %d: sum %g, want %g\n", rank, sum, (double)size * (size + 1) / 2);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0) {
        printf("allreduce of %d ranks: %g\n", size, sum);
    }
    MPI_Finalize();
    return 0;
}
