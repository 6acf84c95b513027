/* The wake-up mechanisms a parked round trip can use, side by side, in C
 * (docs/PERFORMANCE.md, "Forty-first session"): two processes pinned to
 * CPUs 0 and 1 bounce a counter through two shared words, and each side
 * sleeps until the other's word moves, woken by
 *
 *   futex        FUTEX_WAKE on the word (floor.futex);
 *   eventfd      a write of 1 to the sleeper's eventfd, which it watches
 *                in epoll (edge-triggered, exclusive, never read): ferry's
 *                wake-up lines (floor.eventfd);
 *   eventfd-chk  the same, with the fcntl(F_GETFL) ferry makes before it
 *                rings a peer's line (that the peer has not made it blocking);
 *   pipe         a 1-byte write to a pipe whose write end only the ringer
 *                holds (O_NONBLOCK is then the ringer's own: no check), the
 *                sleeper watching the read end and draining it every 256
 *                wake-ups.
 *
 *   gcc -O2 -o /tmp/wake-floors scripts/wake-floors.c
 *   /tmp/wake-floors MECHANISM [ROUND_TRIPS [SLEEP_TIMEOUT_MS]]   # ns a round trip
 *   scripts/wake-floors.sh 20        # 20 runs of each, paired: the ratios' medians
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { FUTEX, EVENTFD, EVENTFD_CHK, PIPE };
static int trips = 20000, timeout_ms = -1;

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

/* One side's way to sleep and to wake the other. */
struct side {
    int mech, epoll, in_fd, out_fd, wakes;
};

static void sleep_until(struct side *s, atomic_uint *word, unsigned v) {
    unsigned seen;
    while ((seen = atomic_load(word)) != v) {
        if (s->mech == FUTEX) {
            /* Sleeps only while the word still holds what was seen. */
            syscall(SYS_futex, word, FUTEX_WAIT, seen, NULL, NULL, 0);
            continue;
        }
        struct epoll_event got[4];
        epoll_wait(s->epoll, got, 4, timeout_ms);
        char buf[4096];
        if (s->mech == PIPE && ++s->wakes % 256 == 0)
            while (read(s->in_fd, buf, sizeof buf) > 0) {}
    }
}

static void wake(struct side *s, atomic_uint *word) {
    uint64_t one = 1;
    switch (s->mech) {
    case FUTEX: syscall(SYS_futex, word, FUTEX_WAKE, 1, NULL, NULL, 0); break;
    case EVENTFD_CHK: if (fcntl(s->out_fd, F_GETFL) < 0) abort(); /* fall through */
    case EVENTFD: if (write(s->out_fd, &one, 8) != 8) abort(); break;
    case PIPE: if (write(s->out_fd, &one, 1) != 1) abort(); break;
    }
}

static void run(struct side *s, atomic_uint *in, atomic_uint *out, int first) {
    if (s->mech != FUTEX) {
        s->epoll = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLET | EPOLLEXCLUSIVE};
        epoll_ctl(s->epoll, EPOLL_CTL_ADD, s->in_fd, &ev);
    }
    for (unsigned v = 1; v <= (unsigned)trips; v++) {
        if (!first) sleep_until(s, in, v);
        atomic_store(out, v);
        wake(s, out);
        if (first) sleep_until(s, in, v);
    }
}

int main(int argc, char **argv) {
    const char *names[] = {"futex", "eventfd", "eventfd-chk", "pipe"};
    int mech = -1;
    for (int i = 0; i < 4 && argc > 1; i++)
        if (!strcmp(argv[1], names[i])) mech = i;
    if (mech < 0) {
        fprintf(stderr, "usage: %s futex|eventfd|eventfd-chk|pipe [ROUND_TRIPS [SLEEP_TIMEOUT_MS]]\n", argv[0]);
        return 2;
    }
    if (argc > 2) trips = atoi(argv[2]);
    if (argc > 3) timeout_ms = atoi(argv[3]);
    atomic_uint *words = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    atomic_uint *ping = &words[0], *pong = &words[32]; /* 128 bytes apart */
    int to_child[2], to_parent[2];
    if (mech == PIPE) {
        pipe2(to_child, O_NONBLOCK | O_CLOEXEC);
        pipe2(to_parent, O_NONBLOCK | O_CLOEXEC);
    } else {
        to_child[0] = to_child[1] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        to_parent[0] = to_parent[1] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    }
    pid_t child = fork();
    if (child == 0) {
        pin(1);
        struct side s = {.mech = mech, .in_fd = to_child[0], .out_fd = to_parent[1]};
        run(&s, ping, pong, 0);
        _exit(0);
    }
    pin(0);
    struct side s = {.mech = mech, .in_fd = to_parent[0], .out_fd = to_child[1]};
    double t = now_ns();
    run(&s, pong, ping, 1);
    double ns = (now_ns() - t) / trips;
    waitpid(child, NULL, 0);
    printf("%s %.0f\n", names[mech], ns);
    return 0;
}
