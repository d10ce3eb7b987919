/*
 * MPI collectives and one-sided communication on every rank, every element checked: what a
 * collective-communication library asks of the fabric. Built by `cargo xtask interop` with
 * mpicc and run there with Debian's OpenMPI over UCX (`--mca pml ucx --mca osc ucx`) on
 * softnic, one device per rank:
 *
 *   softnic-run -- mpirun -np 4 --oversubscribe --mca pml ucx --mca osc ucx \
 *       -x UCX_TLS=rc_verbs,ud_verbs -x UCX_NET_DEVICES=soft0:1 target/interop/mpi_collectives
 *
 * - MPI_Allreduce (sum) and MPI_Bcast of 1 to 1 Mi doubles;
 * - MPI_Alltoall of 16 KiB blocks;
 * - in a window of 512 KiB per rank: MPI_Put to the next rank and MPI_Get from it between
 *   fences, then MPI_Fetch_and_op (sum) by every rank on one word of rank 0, each flushed.
 *
 * Rank 0 prints "mpi: all checks passed" when every check on every rank passed; a failure
 * prints a line starting with "mpi: FAILED" and aborts the job.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define BLOCK 4096          /* ints per Alltoall block */
#define WINDOW (1 << 16)    /* longs per rank's window */
#define ADDS 100            /* fetch-and-adds per rank */

static int rank, ranks;

static void fail(const char *what, long at, double got, double want)
{
    fprintf(stderr, "mpi: FAILED rank %d: %s (element %ld: %g, not %g)\n", rank, what, at, got,
            want);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static void *alloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "mpi: FAILED rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return p;
}

/* Allreduce (sum) and Bcast of `len` doubles. */
static void reduce_and_broadcast(long len)
{
    double *a = alloc(len * sizeof(double)), *b = alloc(len * sizeof(double));
    for (long i = 0; i < len; i++)
        a[i] = rank + (double)i;
    MPI_Allreduce(a, b, (int)len, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    for (long i = 0; i < len; i++) {
        double want = ranks * (double)i + ranks * (ranks - 1) / 2.0;
        if (b[i] != want)
            fail("allreduce", i, b[i], want);
    }
    for (long i = 0; i < len; i++)
        a[i] = rank == 0 ? 7.0 * i : -1.0;
    MPI_Bcast(a, (int)len, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    for (long i = 0; i < len; i++)
        if (a[i] != 7.0 * i)
            fail("bcast", i, a[i], 7.0 * i);
    free(a);
    free(b);
}

static void all_to_all(void)
{
    int *s = alloc((size_t)ranks * BLOCK * sizeof(int));
    int *d = alloc((size_t)ranks * BLOCK * sizeof(int));
    for (long i = 0; i < (long)ranks * BLOCK; i++)
        s[i] = rank * 1000000 + (int)i;
    MPI_Alltoall(s, BLOCK, MPI_INT, d, BLOCK, MPI_INT, MPI_COMM_WORLD);
    for (int p = 0; p < ranks; p++)
        for (long i = 0; i < BLOCK; i++) {
            int want = p * 1000000 + rank * BLOCK + (int)i;
            if (d[p * BLOCK + i] != want)
                fail("alltoall", p * BLOCK + i, d[p * BLOCK + i], want);
        }
    free(s);
    free(d);
}

static void one_sided(void)
{
    long *mine, *src = alloc(WINDOW * sizeof(long)), *got = alloc(WINDOW * sizeof(long));
    MPI_Win win;
    MPI_Win_allocate(WINDOW * sizeof(long), sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, &mine,
                     &win);
    for (long i = 0; i < WINDOW; i++) {
        mine[i] = -1;
        src[i] = rank * 100000L + i;
    }
    int next = (rank + 1) % ranks, prev = (rank + ranks - 1) % ranks;
    MPI_Win_fence(0, win);
    MPI_Put(src, WINDOW, MPI_LONG, next, 0, WINDOW, MPI_LONG, win);
    MPI_Win_fence(0, win);
    for (long i = 0; i < WINDOW; i++)
        if (mine[i] != prev * 100000L + i)
            fail("put", i, (double)mine[i], (double)(prev * 100000L + i));
    MPI_Get(got, WINDOW, MPI_LONG, next, 0, WINDOW, MPI_LONG, win);
    MPI_Win_fence(MPI_MODE_NOSUCCEED, win);
    for (long i = 0; i < WINDOW; i++)
        if (got[i] != src[i])
            fail("get", i, (double)got[i], (double)src[i]);

    long one = 1, old;
    MPI_Win_lock_all(0, win);
    for (int k = 0; k < ADDS; k++) {
        MPI_Fetch_and_op(&one, &old, MPI_LONG, 0, 0, MPI_SUM, win);
        MPI_Win_flush(0, win);
    }
    MPI_Win_unlock_all(win);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
        long want = (ranks - 1) * 100000L + (long)ADDS * ranks;
        if (mine[0] != want)
            fail("fetch_and_op", 0, (double)mine[0], (double)want);
        MPI_Win_unlock(0, win);
    }
    MPI_Win_free(&win);
    free(src);
    free(got);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    for (long len = 1; len <= (1L << 20); len *= 16)
        reduce_and_broadcast(len);
    all_to_all();
    one_sided();
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        printf("mpi: all checks passed (%d ranks)\n", ranks);
    MPI_Finalize();
    return 0;
}
