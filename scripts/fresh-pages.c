/* How fast is memory this process has never touched? Copies SIZE MiB into
 * a fresh malloc'd buffer, ROUNDS times, freeing it after each, with or
 * without MADV_HUGEPAGE on its interior, SLEEP ms apart; prints each
 * round's ms and a warm copy's. What docs/PERFORMANCE.md (issue 16) quotes:
 *   cc -O2 scripts/fresh-pages.c -o /tmp/fresh-pages
 *   /tmp/fresh-pages 64 1 0 10     # 64 MiB, huge pages, back to back
 *   /tmp/fresh-pages 1024 1 3000 6 # 1 GiB, huge pages, 3 s apart
 *   /tmp/fresh-pages 1024 0 3000 6 # the same with 4 KiB pages */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s SIZE_MIB HUGE(0|1) SLEEP_MS ROUNDS\n", argv[0]);
        return 2;
    }
    size_t n = (size_t)atol(argv[1]) << 20, huge_page = 2u << 20;
    int huge = atoi(argv[2]), sleep_ms = atoi(argv[3]), rounds = atoi(argv[4]);
    char *src = malloc(n);
    memset(src, 7, n);
    for (int r = 0; r < rounds; r++) {
        usleep(sleep_ms * 1000);
        double t0 = now_ms();
        char *d = malloc(n);
        uintptr_t a = ((uintptr_t)d + huge_page - 1) & ~(huge_page - 1);
        uintptr_t e = ((uintptr_t)d + n) & ~(huge_page - 1);
        if (huge && e > a)
            madvise((void *)a, e - a, MADV_HUGEPAGE);
        memcpy(d, src, n);
        printf("round %d: %.1f ms\n", r, now_ms() - t0);
        free(d);
    }
    char *w = malloc(n);
    memset(w, 1, n);
    double t0 = now_ms();
    memcpy(w, src, n);
    printf("warm: %.1f ms\n", now_ms() - t0);
    return 0;
}
