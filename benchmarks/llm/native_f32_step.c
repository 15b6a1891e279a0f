/* The demo target's decode step through the native fp32 kernel, from C: the step's 25
 * products in order (6 layers of qkv 512x256, o 256x256, gate/up 1536x256, down 256x768,
 * then the 2048x256 LM head; 19 MB of weights) at 1-9 activation rows, as a speculative
 * verification runs them, for this revision's kernels.c and another's, interleaved
 * (pass by pass, row count by row count, the variants' order alternating), one thread.
 *
 *   N=src/turboinfer/llm/backends/cpu/native
 *   git show REV:$N/kernels.c > /tmp/before.c
 *   R=$(for f in f32_linear int8_linear int4_linear q8_linear simd_level f32_wide_from \
 *       set_prefetch set_prefetch_for prefetch_bytes i8_levels quantize_i8_blocks; \
 *       do printf -- "-Dti_$f=before_$f "; done)
 *   cc -O3 -march=native $R -I$N -c /tmp/before.c -o /tmp/before.o
 *   cc -O3 -march=native -I. -I$N -DKERNELS="\"$N/kernels.c\"" \
 *      benchmarks/llm/native_f32_step.c /tmp/before.o -o /tmp/f32_step -lm
 *   /tmp/f32_step [copies] [passes] [f32=THIS,BEFORE]
 *
 * f32=THIS,BEFORE: each variant's "f32" setting (which a model's load measures; 256 each
 * unless given): below 1024 the 256-bit tiles, the next tile fetched or not (0); from
 * 1024, in a kernels.c that has them (AVX-512), the 512-bit passes, the first fetching
 * that many bytes ahead.
 *
 * copies: copies of the model's weights, one per step in turn (1, the default: what stays
 * in the L3 between steps stays, as in a decode loop; 3: 57 MB, from memory). Prints the
 * median milliseconds per step over the passes (default 31) and each variant's ratio to
 * its own one-row step, as JSON.
 *
 *   /tmp/f32_step [copies] [passes] pages
 *
 * compares page sizes instead of revisions (linking /tmp/before.o all the same): this
 * kernels.c on weights laid out alike in one mapping advised MADV_HUGEPAGE ("this") and
 * in one advised MADV_NOHUGEPAGE ("before"), as llm/backends/cpu/native/hugepages.py places them. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include KERNELS

int64_t before_set_prefetch_for(int kind, int64_t bytes);
int before_f32_linear(const float *x, int64_t rows, int64_t k, const float *w,
                      const float *bias, int64_t n, int64_t kp, float *y);

enum { PRODUCTS = 25, ROWS = 9, MAX_PASSES = 201 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double d = *(const double *)a - *(const double *)b;
    return (d > 0) - (d < 0);
}

typedef int (*linear_fn)(const float *, int64_t, int64_t, const float *, const float *,
                         int64_t, int64_t, float *);

int main(int argc, char **argv) {
    int copies = argc > 1 ? atoi(argv[1]) : 1;
    int passes = argc > 2 ? atoi(argv[2]) : 31;
    int pages = argc > 3 && !strcmp(argv[3], "pages");
    long f32_this = 256, f32_before = 256;
    if (argc > 3 && !strncmp(argv[3], "f32=", 4)
        && sscanf(argv[3] + 4, "%ld,%ld", &f32_this, &f32_before) != 2)
        return 2;
    ti_set_prefetch_for(TI_PREFETCH_F32, f32_this);
    before_set_prefetch_for(TI_PREFETCH_F32, f32_before);
    if (copies < 1 || passes < 1 || passes > MAX_PASSES) return 2;
    static const int layer[][2] = {{512, 256}, {256, 256}, {1536, 256}, {256, 768}};
    int ns[PRODUCTS], ks[PRODUCTS];
    for (int i = 0; i < PRODUCTS; i++) {
        ns[i] = i < 24 ? layer[i % 4][0] : 2048;
        ks[i] = i < 24 ? layer[i % 4][1] : 256;
    }
    /* w: the first variant's weights, then (pages) the second's */
    float **w = malloc((size_t)2 * copies * PRODUCTS * sizeof(float *));
    size_t bytes = 0;
    for (int i = 0; i < PRODUCTS; i++) bytes += ((size_t)ns[i] * ks[i] * 4 + 4095) / 4096 * 4096;
    bytes *= copies;
    for (int v = 0; v < (pages ? 2 : 1); v++) {
        char *arena = NULL;
        if (pages) {
            size_t size = (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
            arena = aligned_alloc(2u << 20, size);
            madvise(arena, size, v == 0 ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
        }
        for (int c = 0; c < copies * PRODUCTS; c++) {
            int i = c % PRODUCTS;
            size_t size = (size_t)ns[i] * ks[i] * 4;
            float *m = pages ? (float *)arena : aligned_alloc(64, size);
            if (pages) arena += (size + 4095) / 4096 * 4096;
            for (long j = 0; j < (long)ns[i] * ks[i]; j++) m[j] = (float)((j * 7 % 13) - 6) * 0.01f;
            w[(size_t)v * copies * PRODUCTS + c] = m;
        }
    }
    /* Aligned as torch's tensors are: a 512-bit load of a row straddles no cache line. */
    float *x = aligned_alloc(64, ROWS * 768 * 4), *y = aligned_alloc(64, ROWS * 2048 * 4);
    for (int i = 0; i < ROWS * 768; i++) x[i] = (i % 5) * 0.1f;
    const linear_fn fns[2] = {ti_f32_linear, pages ? ti_f32_linear : before_f32_linear};
    static double ms[2][ROWS][MAX_PASSES];
    int step = 0;
    for (int p = 0; p < passes; p++)
        for (int r = 1; r <= ROWS; r++)
            for (int turn = 0; turn < 2; turn++) {
                /* ABBA: one variant first in even passes, the other in odd ones (run
                 * second, a variant found the caches as the other left them: 2-7% on a
                 * one-row step in an A/A run with a fixed order). */
                int v = p % 2 ? 1 - turn : turn;
                float *const *m = w + (size_t)(pages ? v : 0) * copies * PRODUCTS
                                  + (size_t)(step++ % copies) * PRODUCTS;
                double t0 = now();
                for (int i = 0; i < PRODUCTS; i++) fns[v](x, r, ks[i], m[i], NULL, ns[i], ks[i], y);
                ms[v][r - 1][p] = (now() - t0) * 1e3;
            }
    printf("{\"copies\": %d, \"passes\": %d, \"f32_setting\": [%ld, %ld], \"compared\": \"%s\", "
           "\"median_ms\": {", copies, passes, f32_this, f32_before,
           pages ? "huge pages (this) / 4 KiB pages (before)" : "revisions");
    for (int v = 0; v < 2; v++) {
        double med[ROWS];
        for (int r = 0; r < ROWS; r++) {
            qsort(ms[v][r], (size_t)passes, sizeof(double), cmp);
            med[r] = ms[v][r][passes / 2];
        }
        printf("%s\"%s\": {", v ? ", " : "", v ? "before" : "this");
        for (int r = 0; r < ROWS; r++) printf("%s\"%d\": %.4f", r ? ", " : "", r + 1, med[r]);
        printf("}, \"%s_over_one_row\": {", v ? "before" : "this");
        for (int r = 0; r < ROWS; r++) printf("%s\"%d\": %.3f", r ? ", " : "", r + 1, med[r] / med[0]);
        printf("}");
    }
    printf("}}\n");
    return 0;
}
