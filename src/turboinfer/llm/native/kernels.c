/* Linear-layer kernels for the LLM engine's decode: y[rows, N] = x[rows, K] @ W.T + b.
 *
 * x and y are float32, row-major. Three weight formats:
 *   - int8: W as int8 [N, kp] (kp = K rounded up to 32, zero padded), |q| <= 127, one
 *     float scale per output channel. Each call quantizes the activations per row to int8
 *     in [-127, 127] and multiplies in integers: vpmaddubsw takes unsigned bytes times
 *     signed bytes, so |x| goes in as the unsigned operand and the weight takes the sign
 *     of x (vpsignb). Each pair of products sums to at most 2 * 127 * 127 = 32258, below
 *     int16's limit: nothing saturates. vpmaddwd with ones then widens to int32.
 *   - int4: W as 4-bit groups of 32 along K, w = q * s + m with q in 0..15 and one
 *     fp16 scale s and minimum m per group; byte j of a group's 16 bytes holds q[j] in its
 *     low nibble and q[j + 16] in its high one. Activations are quantized to int8 per block
 *     of 32 (scale dx), so a group contributes s * dx * sum(q * xq) + m * dx * sum(xq); q is
 *     already unsigned, so vpmaddubsw takes it directly (15 * 127 * 2: no saturation).
 *   - fp32: W as float [N, K], dot products with FMA.
 * Tiles of several output rows share each activation load; with several activation rows
 * each weight load is reused across them (the compute-bound regime of a batch).
 *
 * AVX2 + FMA (+ F16C) paths under #ifdef __AVX2__, plain C otherwise. Single-threaded:
 * the engine measures its thread count, and these run as one of the timed candidates.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TI_AVX2 1
#include <immintrin.h>
#else
#define TI_AVX2 0
#endif

/* 2: AVX2 + FMA + F16C paths; 0: plain C. */
int ti_simd_level(void) { return TI_AVX2 ? 2 : 0; }

/* ---- fp16 scales ----------------------------------------------------------------- */

static inline float half_to_float(uint16_t h) {
#if TI_AVX2
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float value;
    if (exp == 0) {
        value = ldexpf((float)man, -24);              /* zero and subnormals */
    } else if (exp == 31) {
        value = man ? NAN : INFINITY;
    } else {
        value = ldexpf((float)(man | 0x400), (int)exp - 25);
    }
    return sign ? -value : value;
#endif
}

/* ---- activation quantization ----------------------------------------------------- */

static float abs_max(const float *x, int64_t n) {
    int64_t i = 0;
    float m = 0.0f;
#if TI_AVX2
    const __m256 mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 vm = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(vm, _mm256_and_ps(_mm256_loadu_ps(x + i), mask));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    m = _mm_cvtss_f32(h);
#endif
    for (; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

/* q[0..n) = round(x * inv), |q| <= 127; returns the sum of q. */
static int32_t quantize_span(const float *x, int64_t n, float inv, int8_t *q) {
    int64_t i = 0;
    int32_t sum = 0;
#if TI_AVX2
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i vsum = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1);
    for (; i + 32 <= n; i += 32) {
        __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
        __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), vinv));
        __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 16), vinv));
        __m256i d = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 24), vinv));
        __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
        vsum = _mm256_add_epi32(vsum, _mm256_madd_epi16(_mm256_add_epi16(ab, cd), ones));
        __m256i packed = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), perm);
        _mm256_storeu_si256((__m256i *)(q + i), packed);
    }
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(vsum), _mm256_extracti128_si256(vsum, 1));
    s = _mm_hadd_epi32(s, s);
    s = _mm_hadd_epi32(s, s);
    sum = _mm_cvtsi128_si32(s);
#endif
    for (; i < n; i++) {
        float v = nearbyintf(x[i] * inv);
        v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
        q[i] = (int8_t)v;
        sum += q[i];
    }
    return sum;
}

/* Per row: q[r, 0..kp) with zero padding past k, scale[r] = amax / 127. */
static void quantize_rows(const float *x, int64_t rows, int64_t k, int64_t kp, int8_t *q,
                          float *scale) {
    for (int64_t r = 0; r < rows; r++) {
        float amax = abs_max(x + r * k, k);
        scale[r] = amax / 127.0f;
        quantize_span(x + r * k, k, amax > 0.0f ? 127.0f / amax : 0.0f, q + r * kp);
        memset(q + r * kp + k, 0, (size_t)(kp - k));
    }
}

/* Per row and block of 32: q[r, :], dx[r, g] = amax / 127, xsum[r, g] = dx * sum(q). */
static void quantize_blocks(const float *x, int64_t rows, int64_t k, int8_t *q, float *dx,
                            float *xsum) {
    int64_t groups = k / 32;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t g = 0; g < groups; g++) {
            const float *src = x + r * k + g * 32;
            float amax = abs_max(src, 32), d = amax / 127.0f;
            int32_t s = quantize_span(src, 32, amax > 0.0f ? 127.0f / amax : 0.0f,
                                      q + r * k + g * 32);
            dx[r * groups + g] = d;
            xsum[r * groups + g] = d * (float)s;
        }
    }
}

#if TI_AVX2
static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_hadd_epi32(s, s);
    s = _mm_hadd_epi32(s, s);
    return _mm_cvtsi128_si32(s);
}

static inline float hsum_f32(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    return _mm_cvtss_f32(s);
}

/* sum over 32 byte pairs of x * w, as 8 int32 lanes; ax = |x|. */
static inline __m256i dot_i8(__m256i ax, __m256i x, __m256i w, __m256i ones) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w, x)), ones);
}
#endif

/* ---- int8 ------------------------------------------------------------------------ */

/* acc[r * NB + j] = sum_k xq[r, k] * w[j, k] over kp (a multiple of 32). */
#if TI_AVX2
#define I8_TILE(NB, RB)                                                                    \
    static void i8_tile_##NB##_##RB(const int8_t *w, const int8_t *xq, int64_t kp,          \
                                    int32_t *acc) {                                        \
        const __m256i ones = _mm256_set1_epi16(1);                                         \
        __m256i a[RB][NB];                                                                 \
        for (int r = 0; r < RB; r++)                                                       \
            for (int j = 0; j < NB; j++) a[r][j] = _mm256_setzero_si256();                 \
        for (int64_t k = 0; k < kp; k += 32) {                                             \
            __m256i wv[NB];                                                                \
            for (int j = 0; j < NB; j++)                                                   \
                wv[j] = _mm256_loadu_si256((const __m256i *)(w + j * kp + k));             \
            for (int r = 0; r < RB; r++) {                                                 \
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + r * kp + k));       \
                __m256i ax = _mm256_abs_epi8(xv);                                          \
                for (int j = 0; j < NB; j++)                                               \
                    a[r][j] = _mm256_add_epi32(a[r][j], dot_i8(ax, xv, wv[j], ones));      \
            }                                                                              \
        }                                                                                  \
        for (int r = 0; r < RB; r++)                                                       \
            for (int j = 0; j < NB; j++) acc[r * NB + j] = hsum_i32(a[r][j]);              \
    }
#else
#define I8_TILE(NB, RB)                                                                    \
    static void i8_tile_##NB##_##RB(const int8_t *w, const int8_t *xq, int64_t kp,          \
                                    int32_t *acc) {                                        \
        for (int r = 0; r < RB; r++)                                                       \
            for (int j = 0; j < NB; j++) {                                                 \
                int32_t s = 0;                                                             \
                for (int64_t k = 0; k < kp; k++) s += (int32_t)xq[r * kp + k] * w[j * kp + k]; \
                acc[r * NB + j] = s;                                                       \
            }                                                                              \
    }
#endif

I8_TILE(4, 1)
I8_TILE(1, 1)
I8_TILE(2, 4)
I8_TILE(1, 4)

int ti_int8_linear(const float *x, int64_t rows, int64_t k, const int8_t *w,
                    const float *wscale, const float *bias, int64_t n, int64_t kp, float *y) {
    int8_t *xq = (int8_t *)malloc((size_t)(rows * kp) + (size_t)rows * sizeof(float));
    if (!xq) return -1;
    float *xs = (float *)(xq + rows * kp);
    /* rows * kp is a multiple of 32, so xs is aligned for float. */
    quantize_rows(x, rows, k, kp, xq, xs);
    int32_t acc[8];
    int64_t r0 = 0;
    if (rows >= 4) {
        /* Weight tile outside, activation blocks inside: a tile's weights stay in L1
         * while every activation row passes over them. */
        int64_t full = rows - rows % 4;
        int64_t j = 0;
        for (; j + 2 <= n; j += 2) {
            for (int64_t r = 0; r < full; r += 4) {
                i8_tile_2_4(w + j * kp, xq + r * kp, kp, acc);
                for (int a = 0; a < 4; a++)
                    for (int b = 0; b < 2; b++)
                        y[(r + a) * n + j + b] = (float)acc[a * 2 + b] * wscale[j + b] * xs[r + a];
            }
        }
        for (; j < n; j++)
            for (int64_t r = 0; r < full; r += 4) {
                i8_tile_1_4(w + j * kp, xq + r * kp, kp, acc);
                for (int a = 0; a < 4; a++) y[(r + a) * n + j] = (float)acc[a] * wscale[j] * xs[r + a];
            }
        r0 = full;
    }
    for (int64_t r = r0; r < rows; r++) {
        int64_t j = 0;
        for (; j + 4 <= n; j += 4) {
            i8_tile_4_1(w + j * kp, xq + r * kp, kp, acc);
            for (int b = 0; b < 4; b++) y[r * n + j + b] = (float)acc[b] * wscale[j + b] * xs[r];
        }
        for (; j < n; j++) {
            i8_tile_1_1(w + j * kp, xq + r * kp, kp, acc);
            y[r * n + j] = (float)acc[0] * wscale[j] * xs[r];
        }
    }
    if (bias)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < n; j++) y[r * n + j] += bias[j];
    free(xq);
    return 0;
}

/* ---- int4 ------------------------------------------------------------------------ */

/* out[r * NB + j] = sum over groups of s * dx * sum(q * xq) + m * xsum, for NB weight rows
 * (packed rows of k / 2 bytes, scales and minimums rows of k / 32) and RB activation rows. */
#if TI_AVX2
#define I4_TILE(NB, RB)                                                                    \
    static void i4_tile_##NB##_##RB(const uint8_t *w, const uint16_t *sc, const uint16_t *mn, \
                                    const int8_t *xq, const float *dx, const float *xsum,   \
                                    int64_t k, float *out) {                               \
        const int64_t groups = k / 32;                                                     \
        const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0f);           \
        __m256 a[RB][NB];                                                                  \
        for (int r = 0; r < RB; r++)                                                       \
            for (int j = 0; j < NB; j++) a[r][j] = _mm256_setzero_ps();                    \
        for (int64_t g = 0; g < groups; g++) {                                             \
            __m256i wv[NB];                                                                \
            float s[NB];                                                                   \
            for (int j = 0; j < NB; j++) {                                                 \
                __m128i p = _mm_loadu_si128((const __m128i *)(w + j * (k / 2) + g * 16));   \
                __m256i both = _mm256_set_m128i(_mm_srli_epi16(p, 4), p);                 \
                wv[j] = _mm256_and_si256(both, low);                                       \
                s[j] = _cvtsh_ss(sc[j * groups + g]);                                      \
            }                                                                              \
            for (int r = 0; r < RB; r++) {                                                 \
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + r * k + g * 32));   \
                float d = dx[r * groups + g];                                              \
                for (int j = 0; j < NB; j++) {                                             \
                    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv[j], xv), ones);  \
                    a[r][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),                       \
                                              _mm256_set1_ps(s[j] * d), a[r][j]);          \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        for (int r = 0; r < RB; r++)                                                       \
            for (int j = 0; j < NB; j++) {                                                 \
                const uint16_t *m = mn + j * groups;                                       \
                const float *xs = xsum + r * groups;                                       \
                __m256 t = a[r][j];                                                        \
                int64_t g = 0;                                                             \
                for (; g + 8 <= groups; g += 8)                                            \
                    t = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + g))), \
                                        _mm256_loadu_ps(xs + g), t);                       \
                float v = hsum_f32(t);                                                     \
                for (; g < groups; g++) v += _cvtsh_ss(m[g]) * xs[g];                     \
                out[r * NB + j] = v;                                                       \
            }                                                                              \
    }
#else
#define I4_TILE(NB, RB)                                                                    \
    static void i4_tile_##NB##_##RB(const uint8_t *w, const uint16_t *sc, const uint16_t *mn, \
                                    const int8_t *xq, const float *dx, const float *xsum,   \
                                    int64_t k, float *out) {                               \
        const int64_t groups = k / 32;                                                     \
        for (int r = 0; r < RB; r++)                                                       \
            for (int j = 0; j < NB; j++) {                                                 \
                float v = 0.0f;                                                            \
                for (int64_t g = 0; g < groups; g++) {                                     \
                    const uint8_t *p = w + j * (k / 2) + g * 16;                           \
                    const int8_t *xv = xq + r * k + g * 32;                                \
                    int32_t s = 0;                                                         \
                    for (int i = 0; i < 16; i++)                                           \
                        s += (p[i] & 0x0f) * xv[i] + (p[i] >> 4) * xv[i + 16];             \
                    v += half_to_float(sc[j * groups + g]) * dx[r * groups + g] * (float)s  \
                         + half_to_float(mn[j * groups + g]) * xsum[r * groups + g];        \
                }                                                                          \
                out[r * NB + j] = v;                                                       \
            }                                                                              \
    }
#endif

I4_TILE(4, 1)
I4_TILE(1, 1)
I4_TILE(2, 4)
I4_TILE(1, 4)

/* k must be a multiple of 32. */
int ti_int4_linear(const float *x, int64_t rows, int64_t k, const uint8_t *w,
                    const uint16_t *scales, const uint16_t *mins, const float *bias,
                    int64_t n, float *y) {
    const int64_t groups = k / 32;
    float *dx = (float *)malloc((size_t)(2 * rows * groups) * sizeof(float) + (size_t)(rows * k));
    if (!dx) return -1;
    float *xsum = dx + rows * groups;
    int8_t *xq = (int8_t *)(xsum + rows * groups);
    quantize_blocks(x, rows, k, xq, dx, xsum);
    float acc[8];
#define I4_ARGS(j, r) w + (j) * (k / 2), scales + (j) * groups, mins + (j) * groups,        \
                      xq + (r) * k, dx + (r) * groups, xsum + (r) * groups, k, acc
    int64_t r0 = 0;
    if (rows >= 4) {
        int64_t full = rows - rows % 4, j = 0;
        for (; j + 2 <= n; j += 2)
            for (int64_t r = 0; r < full; r += 4) {
                i4_tile_2_4(I4_ARGS(j, r));
                for (int a = 0; a < 4; a++)
                    for (int b = 0; b < 2; b++) y[(r + a) * n + j + b] = acc[a * 2 + b];
            }
        for (; j < n; j++)
            for (int64_t r = 0; r < full; r += 4) {
                i4_tile_1_4(I4_ARGS(j, r));
                for (int a = 0; a < 4; a++) y[(r + a) * n + j] = acc[a];
            }
        r0 = full;
    }
    for (int64_t r = r0; r < rows; r++) {
        int64_t j = 0;
        for (; j + 4 <= n; j += 4) {
            i4_tile_4_1(I4_ARGS(j, r));
            for (int b = 0; b < 4; b++) y[r * n + j + b] = acc[b];
        }
        for (; j < n; j++) {
            i4_tile_1_1(I4_ARGS(j, r));
            y[r * n + j] = acc[0];
        }
    }
#undef I4_ARGS
    if (bias)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < n; j++) y[r * n + j] += bias[j];
    free(dx);
    return 0;
}

/* ---- fp32 ------------------------------------------------------------------------ */

#if TI_AVX2
/* Two accumulators per (row, output) pair along k: FMA's latency needs that many
 * independent sums to keep both FMA pipes busy at one activation row. */
#define F32_TILE(NB, RB)                                                                   \
    static void f32_tile_##NB##_##RB(const float *w, const float *x, int64_t k, float *out) { \
        __m256 a[RB][NB], b[RB][NB];                                                       \
        for (int r = 0; r < RB; r++)                                                       \
            for (int j = 0; j < NB; j++) a[r][j] = b[r][j] = _mm256_setzero_ps();          \
        int64_t i = 0;                                                                     \
        for (; i + 16 <= k; i += 16) {                                                     \
            __m256 w0[NB], w1[NB];                                                         \
            for (int j = 0; j < NB; j++) {                                                 \
                w0[j] = _mm256_loadu_ps(w + j * k + i);                                    \
                w1[j] = _mm256_loadu_ps(w + j * k + i + 8);                                \
            }                                                                              \
            for (int r = 0; r < RB; r++) {                                                 \
                __m256 x0 = _mm256_loadu_ps(x + r * k + i);                                \
                __m256 x1 = _mm256_loadu_ps(x + r * k + i + 8);                            \
                for (int j = 0; j < NB; j++) {                                             \
                    a[r][j] = _mm256_fmadd_ps(w0[j], x0, a[r][j]);                         \
                    b[r][j] = _mm256_fmadd_ps(w1[j], x1, b[r][j]);                         \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        for (int r = 0; r < RB; r++)                                                       \
            for (int j = 0; j < NB; j++) {                                                 \
                float v = hsum_f32(_mm256_add_ps(a[r][j], b[r][j]));                       \
                for (int64_t t = i; t < k; t++) v += w[j * k + t] * x[r * k + t];          \
                out[r * NB + j] = v;                                                       \
            }                                                                              \
    }
#else
#define F32_TILE(NB, RB)                                                                   \
    static void f32_tile_##NB##_##RB(const float *w, const float *x, int64_t k, float *out) { \
        for (int r = 0; r < RB; r++)                                                       \
            for (int j = 0; j < NB; j++) {                                                 \
                float v = 0.0f;                                                            \
                for (int64_t t = 0; t < k; t++) v += w[j * k + t] * x[r * k + t];          \
                out[r * NB + j] = v;                                                       \
            }                                                                              \
    }
#endif

F32_TILE(4, 1)
F32_TILE(1, 1)
F32_TILE(2, 2)
F32_TILE(1, 2)

int ti_f32_linear(const float *x, int64_t rows, int64_t k, const float *w,
                   const float *bias, int64_t n, float *y) {
    float acc[8];
    int64_t r0 = 0;
    if (rows >= 2) {
        int64_t full = rows - rows % 2, j = 0;
        for (; j + 2 <= n; j += 2)
            for (int64_t r = 0; r < full; r += 2) {
                f32_tile_2_2(w + j * k, x + r * k, k, acc);
                for (int a = 0; a < 2; a++)
                    for (int b = 0; b < 2; b++) y[(r + a) * n + j + b] = acc[a * 2 + b];
            }
        for (; j < n; j++)
            for (int64_t r = 0; r < full; r += 2) {
                f32_tile_1_2(w + j * k, x + r * k, k, acc);
                for (int a = 0; a < 2; a++) y[(r + a) * n + j] = acc[a];
            }
        r0 = full;
    }
    for (int64_t r = r0; r < rows; r++) {
        int64_t j = 0;
        for (; j + 4 <= n; j += 4) {
            f32_tile_4_1(w + j * k, x + r * k, k, acc);
            for (int b = 0; b < 4; b++) y[r * n + j + b] = acc[b];
        }
        for (; j < n; j++) {
            f32_tile_1_1(w + j * k, x + r * k, k, acc);
            y[r * n + j] = acc[0];
        }
    }
    if (bias)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < n; j++) y[r * n + j] += bias[j];
    return 0;
}
