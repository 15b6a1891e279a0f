/* The int8 linear layer on Intel AMX tiles (Sapphire Rapids and later).
 *
 * The activations are quantized exactly as kernels.c's int8 kernel quantizes them (int8
 * per block of 32 with an integer multiplier m, 1-255, of one scale per row), so the two
 * kernels run the same quantized model. AMX multiplies bytes only, and x * m needs 16
 * bits, so each activation goes in as two unsigned bytes: x * m = 256 * (hi - 128) + lo
 * with lo = (x * m) & 255 and hi = ((x * m) >> 8) + 128 (1..254). One activation tile
 * holds a pass's rows twice, their lo bytes above their hi bytes (8 rows a pass), so one
 * tdpbusd per weight tile gives both sums, and
 *     sum(x * m * w) = 256 * (sum(hi * w) - 128 * sum(w)) + sum(lo * w)
 * exactly, sum(w) per output row stored beside its weights. It is scaled once per output
 * (as a float: the exact int64 total rounded once, times the weight's scale, times the
 * row's), so a row's outputs do not depend on the rows beside it: a speculative
 * verification of 8 tokens gives each token the logits a one-token step gives it.
 *
 * Weights (layout.py's amx_int8_tiles): blocks of 16 output rows, each 16 * kp bytes of
 * 1,024-byte tiles in AMX's B layout (one per 64 input columns: tile row r holds the 16
 * outputs' columns 4r..4r+3 side by side), then the 16 rows' int32 sums; block b starts
 * at byte b * (16 * kp + 64). A pass runs two blocks at once (2 accumulators), and
 * consecutive chunks of 64 columns alternate between two sets of the activation tile and
 * the 2 weight tiles: all 8 of AMX's tile registers. A tile load waits for every multiply
 * still reading its register, so with one set the loads and multiplies took turns (Xeon,
 * one core, a 1280 x 768 layer at 256 rows: 210 G multiply-adds/s with one set of 3
 * blocks, 430 with two sets of 2).
 *
 * Bounds: sum(hi * w) and sum(lo * w) <= 255 * 127 * kp stay in int32 for kp <= 65536.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native.h"

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512BW__) \
    && defined(__AVX512DQ__) && defined(__x86_64__) && defined(__linux__)
#define TI_AMX 1
#include <immintrin.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define TI_AMX 0
#endif

#define AMX_BLOCK 16        /* output rows per weight block */
#define AMX_PASS 8          /* activation rows per pass (twice that in the tile) */
#define AMX_CHUNK 64        /* input columns per tile */
#define AMX_MAX_KP 65536
#define AMX_GROUP 2         /* weight blocks per pass */

#if TI_AMX
/* Linux hands a process the tile registers' 8 KiB of state only when asked once. */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
static pthread_once_t permission_once = PTHREAD_ONCE_INIT;
static int permitted;

static void request_permission(void) {
    permitted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Tiles 0 and 3: activations, 2 * rows x 64 bytes. 1-2, 4-5: weight tiles, 16 x 64.
 * 6-7: the accumulators, 2 * rows x 16 int32. */
static void configure(int rows) {
    tile_config c __attribute__((aligned(64)));
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.rows[t] = (uint8_t)(t == 1 || t == 2 || t == 4 || t == 5 ? 16 : 2 * rows);
        c.colsb[t] = 64;
    }
    _tile_loadconfig(&c);
}

/* y[r, col] for the pass's live rows and the block's valid columns: the exact total
 * (int64), rounded once to float, times the weight's scale, times the row's. acc: the
 * pass's lo sums (rows x 16) above its hi sums; sums: the block's sum(w) per column. */
static void finish_block(const int32_t *acc, int rows, int live, const int32_t *sums,
                         const float *wscale, const float *xs, int64_t n, int64_t col,
                         float *y) {
    int width = n - col < AMX_BLOCK ? (int)(n - col) : AMX_BLOCK;
    __mmask16 valid = (__mmask16)((1u << width) - 1);
    __m512 ws = _mm512_maskz_loadu_ps(valid, wscale + col);
    __m512i s = _mm512_slli_epi32(_mm512_loadu_si512((const void *)sums), 7);  /* 128 sum(w) */
    __m256i s0 = _mm512_castsi512_si256(s), s1 = _mm512_extracti64x4_epi64(s, 1);
    for (int r = 0; r < live; r++) {
        __m512i l = _mm512_load_si512((const void *)(acc + r * 16));
        __m512i h = _mm512_load_si512((const void *)(acc + (rows + r) * 16));
        /* hi sums less 128 sum(w), in int64: 256 * that + lo is the exact total */
        __m512i h0 = _mm512_sub_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(h)),
                                      _mm512_cvtepi32_epi64(s0));
        __m512i h1 = _mm512_sub_epi64(_mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(h, 1)),
                                      _mm512_cvtepi32_epi64(s1));
        __m256 t0 = _mm512_cvtepi64_ps(_mm512_add_epi64(
            _mm512_slli_epi64(h0, 8), _mm512_cvtepi32_epi64(_mm512_castsi512_si256(l))));
        __m256 t1 = _mm512_cvtepi64_ps(_mm512_add_epi64(
            _mm512_slli_epi64(h1, 8), _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(l, 1))));
        __m512 total = _mm512_insertf32x8(_mm512_castps256_ps512(t0), t1, 1);
        __m512 out = _mm512_mul_ps(_mm512_mul_ps(total, ws), _mm512_set1_ps(xs[r]));
        _mm512_mask_storeu_ps(y + r * n + col, valid, out);
    }
}

/* The 32 lines of two consecutive 1 KiB weight tiles (ti_prefetch_bytes ahead). */
static inline void prefetch_tiles(const int8_t *p) {
    for (int i = 0; i < 2048; i += 64) _mm_prefetch((const char *)p + i, _MM_HINT_T0);
}

/* G (1-2) weight blocks from `wb` against every pass of activation rows. Consecutive
 * chunks alternate between two sets of tile registers (activations 0 and 3, weights 1-2
 * and 4-5): a tile load into a register a multiply is still reading waits for it, which
 * serialized loads and multiplies (1.9x slower with one set). Accumulators 6-7. */
#define AMX_RUN(G)                                                                          \
    static void run_##G(const int8_t *wb, int64_t stride, const uint8_t *a, int64_t chunks,    \
                        int64_t kp, int64_t rows, int pr, const float *wscale, const float *xs, \
                        int64_t n, int64_t col, float *y, int32_t (*acc)[2 * AMX_PASS * 16]) { \
        const int8_t *w1 = wb + stride;                                                    \
        const int64_t pf = ti_prefetch_bytes(TI_PREFETCH_AMX);                             \
        for (int64_t r0 = 0; r0 < rows; r0 += pr) {                                        \
            const uint8_t *ar = a + 2 * r0 * kp;                                           \
            _tile_zero(6);                                                                 \
            if (G > 1) _tile_zero(7);                                                      \
            int64_t c = 0;                                                                 \
            for (; c + 2 <= chunks; c += 2) {                                              \
                if (r0 == 0) { /* later passes find the block in cache */                  \
                    prefetch_tiles(wb + c * 1024 + pf);                                    \
                    if (G > 1) prefetch_tiles(w1 + c * 1024 + pf);                         \
                }                                                                          \
                _tile_loadd(0, ar + c * AMX_CHUNK, kp);                                    \
                _tile_loadd(1, wb + c * 1024, 64);                                         \
                if (G > 1) _tile_loadd(2, w1 + c * 1024, 64);                              \
                _tile_dpbusd(6, 0, 1);                                                     \
                if (G > 1) _tile_dpbusd(7, 0, 2);                                          \
                _tile_loadd(3, ar + (c + 1) * AMX_CHUNK, kp);                              \
                _tile_loadd(4, wb + (c + 1) * 1024, 64);                                   \
                if (G > 1) _tile_loadd(5, w1 + (c + 1) * 1024, 64);                        \
                _tile_dpbusd(6, 3, 4);                                                     \
                if (G > 1) _tile_dpbusd(7, 3, 5);                                          \
            }                                                                              \
            if (c < chunks) {                                                              \
                _tile_loadd(0, ar + c * AMX_CHUNK, kp);                                    \
                _tile_loadd(1, wb + c * 1024, 64);                                         \
                if (G > 1) _tile_loadd(2, w1 + c * 1024, 64);                              \
                _tile_dpbusd(6, 0, 1);                                                     \
                if (G > 1) _tile_dpbusd(7, 0, 2);                                          \
            }                                                                              \
            _tile_stored(6, acc[0], 64);                                                   \
            if (G > 1) _tile_stored(7, acc[1], 64);                                        \
            int live = rows - r0 < pr ? (int)(rows - r0) : pr;                             \
            for (int g = 0; g < G; g++)                                                    \
                finish_block(acc[g], pr, live, (const int32_t *)(wb + g * stride + 16 * kp),  \
                             wscale, xs + r0, n, col + g * AMX_BLOCK, y + r0 * n);         \
        }                                                                                  \
    }
AMX_RUN(1)
AMX_RUN(2)
#endif

int ti_amx_available(void) {
#if TI_AMX
    pthread_once(&permission_once, request_permission);
    return permitted;
#else
    return 0;
#endif
}

int ti_amx_int8_linear(const float *x, int64_t rows, int64_t k, const int8_t *w,
                       const float *wscale, const float *bias, int64_t n, int64_t kp,
                       float *y) {
#if TI_AMX
    if (kp % AMX_CHUNK || kp < k || kp > AMX_MAX_KP) return -2;
    if (!ti_amx_available()) return -3;
    const int64_t blocks32 = kp / 32, chunks = kp / AMX_CHUNK;
    /* Past one pass the rows are padded with zeros to whole passes, so every pass has
     * the same tile shape (one configuration); the padding rows are not written. */
    const int pr = rows < AMX_PASS ? (int)rows : AMX_PASS;
    const int64_t padded = (rows + pr - 1) / pr * pr;
    /* a: per pass, its rows' lo bytes then their hi bytes (2 * padded * kp); xq, m, the
     * row scales; 64-byte aligned */
    size_t bytes = (size_t)((2 * padded + rows) * kp)
                   + (size_t)(rows * blocks32) * sizeof(int16_t) + (size_t)rows * sizeof(float);
    uint8_t *a = (uint8_t *)aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!a) return -1;
    int8_t *xq = (int8_t *)(a + 2 * padded * kp);
    int16_t *m = (int16_t *)(xq + rows * kp);
    float *xs = (float *)(m + rows * blocks32);
    ti_quantize_i8_blocks(x, rows, k, kp, ti_i8_levels(kp), xq, m, xs);
    const __m512i bias128 = _mm512_set1_epi16(128);
    for (int64_t r = 0; r < padded; r++) {
        uint8_t *lo = a + (2 * (r / pr * pr) + r % pr) * kp, *hi = lo + pr * kp;
        if (r >= rows) {       /* a padding row: x * m = 0 */
            memset(lo, 0, (size_t)kp);
            memset(hi, 128, (size_t)kp);
            continue;
        }
        for (int64_t b = 0; b < blocks32; b++) {
            __m512i v = _mm512_mullo_epi16(
                _mm512_cvtepi8_epi16(
                    _mm256_loadu_si256((const __m256i *)(xq + r * kp + 32 * b))),
                _mm512_set1_epi16(m[r * blocks32 + b]));
            _mm256_storeu_si256((__m256i *)(lo + 32 * b), _mm512_cvtepi16_epi8(v));
            _mm256_storeu_si256((__m256i *)(hi + 32 * b), _mm512_cvtepi16_epi8(
                                    _mm512_add_epi16(_mm512_srai_epi16(v, 8), bias128)));
        }
    }
    int32_t acc[AMX_GROUP][2 * AMX_PASS * 16] __attribute__((aligned(64)));
    const int64_t nblocks = (n + AMX_BLOCK - 1) / AMX_BLOCK, stride = AMX_BLOCK * kp + 64;
    configure(pr);
    /* Groups of weight blocks outside, passes of activation rows inside: a group's
     * weights (32 * kp bytes) stay in L1/L2 while every pass meets them. */
    for (int64_t nb = 0; nb < nblocks; nb += AMX_GROUP) {
        const int8_t *wb = w + nb * stride;
        int64_t col = nb * AMX_BLOCK;
        if (nblocks - nb >= 2)
            run_2(wb, stride, a, chunks, kp, rows, pr, wscale, xs, n, col, y, acc);
        else
            run_1(wb, stride, a, chunks, kp, rows, pr, wscale, xs, n, col, y, acc);
    }
    _tile_release();
    free(a);
    if (bias)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < n; j++) y[r * n + j] += bias[j];
    return 0;
#else
    (void)x; (void)rows; (void)k; (void)w; (void)wscale; (void)bias; (void)n; (void)kp;
    (void)y;
    return -3;
#endif
}
