/* The native fp32 kernel alone, from C: G multiply-adds/s of ti_f32_linear per shape
 * (the demo model's and the 110M model's) at 1-16 rows, and the machine's FMA peak from a
 * register-only loop (10 independent FMA chains), one thread.
 *
*   cc -O3 -march=native -I. -DKERNELS='"src/turboinfer/llm/backends/cpu/native/kernels.c"' \
 *      benchmarks/llm/native_f32_rows.c -o /tmp/f32_rows -lm && /tmp/f32_rows [copies]
 *
 * copies: weight copies rotated per call (1, the default: in cache; 0: as many as make
 * 64 MB, read from memory). KERNELS may name kernels.c of another revision (git show
 * REV:src/turboinfer/llm/backends/cpu/native/kernels.c > /tmp/old.c) to compare back to back.
 * Best of 9 runs of 30 ms each; the layout does not matter for the timing (the weights
 * are arbitrary numbers), the products are verified by tests/llm/test_native_kernels.py. */
#include <stdio.h>
#include <time.h>
#include KERNELS

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static double fma_peak(void) {
#if TI_AVX2
    __m256 a[10], m = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(0.0001f);
    for (int i = 0; i < 10; i++) a[i] = _mm256_set1_ps(i * 0.001f);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        long n = 20000000;
        double t0 = now();
        for (long i = 0; i < n; i++) {
            for (int j = 0; j < 10; j++) a[j] = _mm256_fmadd_ps(a[j], m, c);
            __asm__("" : : "x"(a[0]));
        }
        double g = n * 10 * 8 / (now() - t0) / 1e9;
        if (g > best) best = g;
    }
    float s = 0;
    for (int i = 0; i < 10; i++) s += a[i][0];
    return best + 0 * s;
#else
    return 0;
#endif
}

int main(int argc, char **argv) {
    int copies_arg = argc > 1 ? atoi(argv[1]) : 1;
    static const int shapes[][2] = {{512, 256}, {256, 256}, {1536, 256}, {256, 768},
                                    {2048, 256}, {1280, 768}, {768, 768}, {4096, 768},
                                    {768, 2048}};
    static const int rows_list[] = {1, 2, 3, 4, 5, 7, 9, 16};
    printf("FMA peak %.1f G multiply-adds/s\n", fma_peak());
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int n = shapes[s][0], k = shapes[s][1];
        int copies = copies_arg > 0 ? copies_arg : (int)(64e6 / (n * (double)k * 4));
        if (copies < 1) copies = 1;
        float **w = malloc(copies * sizeof(float *));
        for (int c = 0; c < copies; c++) {
            w[c] = aligned_alloc(64, (size_t)n * k * 4);
            for (long i = 0; i < (long)n * k; i++) w[c][i] = (float)((i * 7 % 13) - 6) * 0.01f;
        }
        float *x = malloc(16 * (size_t)k * 4), *y = malloc(16 * (size_t)n * 4);
        for (int i = 0; i < 16 * k; i++) x[i] = (i % 5) * 0.1f;
        printf("%5dx%-5d", n, k);
        for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0]; ri++) {
            int rows = rows_list[ri];
            double best = 1e9;
            for (int rep = 0; rep < 9; rep++) {
                long calls = 0;
                double t0 = now(), t;
                do {
                    for (int c = 0; c < copies; c++) ti_f32_linear(x, rows, k, w[c], NULL, n, k, y);
                    calls += copies;
                } while ((t = now() - t0) < 0.03);
                if (t / calls < best) best = t / calls;
            }
            printf(" r%d %.1fG", rows, (double)rows * n * k / best / 1e9);
        }
        printf("\n");
        for (int c = 0; c < copies; c++) free(w[c]);
        free(w);
        free(x);
        free(y);
    }
    return 0;
}
