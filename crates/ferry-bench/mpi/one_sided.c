/* MPI one-sided latency as the OSU benchmarks measure it (osu_get_latency,
 * osu_put_latency, osu_fop_latency with `-w allocate -s lock_all`): two
 * ranks, a window from MPI_Win_allocate, MPI_Win_lock_all once, then per
 * operation one 8-byte MPI_Get / MPI_Put / MPI_Fetch_and_op(MPI_SUM,
 * MPI_UINT64_T) on rank 1's window followed by MPI_Win_flush(1). Rank 0
 * times; rank 1 only waits in MPI_Barrier.
 *
 * Usage: one_sided get|put|fetch_add ITERS ROUNDS WARMUP [CPU0 CPU1]
 * Prints on rank 0's stdout one line per timed round: ns per operation.
 * WARMUP untimed rounds come first. CPUn (if given, >= 0) pins rank n
 * there: mpirun is run with `--bind-to none`, the bench chooses the CPUs.
 * Exits non-zero if the target's word does not end as the operations
 * should have left it. Part of ferry-bench (src/mpi_peer.rs builds it). */
#define _GNU_SOURCE
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum op { GET, PUT, FETCH_ADD };

/* What rank 1's word holds before any operation (a get reads it back). */
#define INITIAL UINT64_C(0x0102030405060708)

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void pin(int cpu) {
    if (cpu < 0)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        perror("one_sided: sched_setaffinity"); /* best effort, like the harness */
}

static _Noreturn void fail(const char *msg) {
    fprintf(stderr, "one_sided: %s\n", msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2); /* MPI_Abort does not return; the compiler does not know */
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2 || (argc != 5 && argc != 7))
        fail("usage: mpirun -np 2 one_sided get|put|fetch_add ITERS ROUNDS WARMUP [CPU0 CPU1]");
    enum op op;
    if (strcmp(argv[1], "get") == 0)
        op = GET;
    else if (strcmp(argv[1], "put") == 0)
        op = PUT;
    else if (strcmp(argv[1], "fetch_add") == 0)
        op = FETCH_ADD;
    else
        fail("the operation is get, put or fetch_add");
    long iters = atol(argv[2]), rounds = atol(argv[3]), warmup = atol(argv[4]);
    if (iters < 1 || rounds < 1 || warmup < 0)
        fail("ITERS and ROUNDS must be at least 1, WARMUP at least 0");
    if (argc == 7)
        pin(atoi(argv[5 + rank]));

    uint64_t *base;
    MPI_Win win;
    /* A page: the word rank 0 reaches is alone on its line. */
    MPI_Win_allocate(4096, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rank, 0, win);
    base[0] = INITIAL;
    MPI_Win_unlock(rank, win);
    MPI_Barrier(MPI_COMM_WORLD);

    long total = (warmup + rounds) * iters;
    int bad = 0;
    if (rank == 0) {
        double *samples = malloc(sizeof(double) * (size_t)rounds);
        uint64_t value = 0, one = 1, result = 0, sent = 0;
        MPI_Win_lock_all(0, win);
        for (long r = 0; r < warmup + rounds; r++) {
            double start = now_ns();
            for (long i = 0; i < iters; i++) {
                switch (op) {
                case GET:
                    MPI_Get(&value, 8, MPI_BYTE, 1, 0, 8, MPI_BYTE, win);
                    break;
                case PUT:
                    sent++;
                    MPI_Put(&sent, 8, MPI_BYTE, 1, 0, 8, MPI_BYTE, win);
                    break;
                case FETCH_ADD:
                    MPI_Fetch_and_op(&one, &result, MPI_UINT64_T, 1, 0, MPI_SUM, win);
                    break;
                }
                MPI_Win_flush(1, win);
            }
            double end = now_ns();
            if (r >= warmup)
                samples[r - warmup] = (end - start) / (double)iters;
        }
        MPI_Win_unlock_all(win);
        /* Checked after timing, so the loop is what OSU times. */
        if (op == GET && value != INITIAL)
            bad = 1;
        if (op == FETCH_ADD && result != INITIAL + (uint64_t)total - 1)
            bad = 1;
        for (long r = 0; r < rounds; r++)
            printf("%.3f\n", samples[r]);
        fflush(stdout);
        free(samples);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) {
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 1, 0, win);
        uint64_t want = op == PUT ? (uint64_t)total : op == FETCH_ADD ? INITIAL + (uint64_t)total : INITIAL;
        bad = base[0] != want;
        MPI_Win_unlock(1, win);
    }
    if (bad)
        fprintf(stderr, "one_sided: rank %d: %s left the wrong value\n", rank, argv[1]);
    MPI_Win_free(&win);
    MPI_Finalize();
    return bad ? 3 : 0;
}
