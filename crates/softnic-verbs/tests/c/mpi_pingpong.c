/*
 * Two MPI ranks: a ping-pong (latency at 8 bytes and 64 KiB) and a bandwidth test (windows of
 * non-blocking 64 KiB sends), every byte of every message checked. Built by `cargo xtask
 * interop` with mpicc and run there with Debian's OpenMPI over UCX (`--mca pml ucx`) on
 * softnic, one device per rank:
 *
 *   softnic-run -- mpirun -np 2 --mca pml ucx -x UCX_TLS=rc_verbs,ud_verbs \
 *       -x UCX_NET_DEVICES=soft0:1 target/interop/mpi_pingpong [ITERATIONS]
 *
 * Rank 0 prints the figures and, when every check passed, "mpi: all checks passed"; any
 * failure prints a line starting with "mpi: FAILED" and aborts the job.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW 16
#define BIG (64 * 1024)

static int rank;

static void fail(const char *what, int iter, size_t at)
{
    fprintf(stderr, "mpi: FAILED rank %d: %s (iteration %d, byte %zu)\n", rank, what, iter,
            at);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* The byte at `i` of message `seq` of size `n`. */
static unsigned char pattern(int seq, size_t i, size_t n)
{
    return (unsigned char)(seq * 131 + i * 7 + n);
}

static void fill(unsigned char *buf, size_t n, int seq)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = pattern(seq, i, n);
}

static void check(const unsigned char *buf, size_t n, int seq, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (buf[i] != pattern(seq, i, n))
            fail(what, seq, i);
}

/* Round trips of `n` bytes; returns the average one-way time in microseconds. */
static double pingpong(unsigned char *buf, size_t n, int iters)
{
    int peer = 1 - rank;
    double start = MPI_Wtime();
    for (int it = 0; it < iters; it++) {
        if (rank == 0) {
            fill(buf, n, it);
            MPI_Send(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
            memset(buf, 0, n);
            MPI_Recv(buf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            check(buf, n, it + 1, "pong");
        } else {
            MPI_Recv(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            check(buf, n, it, "ping");
            fill(buf, n, it + 1);
            MPI_Send(buf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
        }
    }
    return (MPI_Wtime() - start) * 1e6 / (2.0 * iters);
}

/* Windows of WINDOW sends of BIG bytes from rank 0 to rank 1; returns MB/s. */
static double bandwidth(unsigned char *bufs, int iters)
{
    MPI_Request req[WINDOW];
    char ack = 0;
    double start = MPI_Wtime();
    for (int it = 0; it < iters; it++) {
        for (int w = 0; w < WINDOW; w++) {
            unsigned char *b = bufs + (size_t)w * BIG;
            if (rank == 0) {
                fill(b, BIG, it * WINDOW + w);
                MPI_Isend(b, BIG, MPI_BYTE, 1, 3, MPI_COMM_WORLD, &req[w]);
            } else {
                MPI_Irecv(b, BIG, MPI_BYTE, 0, 3, MPI_COMM_WORLD, &req[w]);
            }
        }
        MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
        if (rank == 1)
            for (int w = 0; w < WINDOW; w++)
                check(bufs + (size_t)w * BIG, BIG, it * WINDOW + w, "bandwidth");
        if (rank == 0)
            MPI_Recv(&ack, 1, MPI_BYTE, 1, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        else
            MPI_Send(&ack, 1, MPI_BYTE, 0, 4, MPI_COMM_WORLD);
    }
    double secs = MPI_Wtime() - start;
    return (double)iters * WINDOW * BIG / secs / 1e6;
}

int main(int argc, char **argv)
{
    int size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        if (rank == 0)
            fprintf(stderr, "mpi: FAILED: run with 2 ranks, not %d\n", size);
        MPI_Finalize();
        return 1;
    }
    int iters = argc > 1 ? atoi(argv[1]) : 100;
    if (iters <= 0)
        iters = 100;
    unsigned char *bufs = malloc((size_t)WINDOW * BIG);
    if (bufs == NULL)
        fail("malloc", 0, 0);
    double small = pingpong(bufs, 8, iters);
    double large = pingpong(bufs, BIG, iters);
    double bw = bandwidth(bufs, iters / 4 > 0 ? iters / 4 : 1);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        printf("mpi: ping-pong 8 B: %.2f us one way\n", small);
        printf("mpi: ping-pong %d B: %.2f us one way\n", BIG, large);
        printf("mpi: bandwidth %d B x %d in flight: %.1f MB/s\n", BIG, WINDOW, bw);
        printf("mpi: all checks passed\n");
    }
    free(bufs);
    MPI_Finalize();
    return 0;
}
