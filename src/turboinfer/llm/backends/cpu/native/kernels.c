/* Linear-layer kernels for the LLM engine's decode: y[rows, N] = x[rows, K] @ W.T + b.
 *
 * x and y are float32, row-major. Three weight formats:
 *   - int8: W as int8 [N, kp] (kp = K rounded up to 32, zero padded), |q| <= 127, one
 *     float scale per output channel. Each call quantizes the activations to int8 in
 *     [-127, 127] per block of 32, each block's scale an integer multiple m (1..255) of
 *     one per row, and multiplies in integers: vpmaddubsw takes unsigned bytes times
 *     signed bytes, so |x| goes in as the unsigned operand and the weight takes the sign
 *     of x (vpsignb). Each pair of products sums to at most 2 * 127 * 127 = 32258, below
 *     int16's limit: nothing saturates. vpmaddwd by m then widens to int32.
 *   - int4: W as 4-bit groups of 32 along K, w = q * s + m with q in 0..15 and one
 *     fp16 scale s and minimum m per group; byte j of a group's 16 bytes holds q[j] in its
 *     low nibble and q[j + 16] in its high one. Activations are quantized to int8 per
 *     group of 32 (scale dx), so a group contributes dx * (s * sum(q * xq) + m * sum(xq));
 *     q is already unsigned, so vpmaddubsw takes it directly (15 * 127 * 2: no saturation).
 *   - fp32: W as float [N, K], dot products with FMA.
 * One activation scale per row instead of per block of 32 cost SmolLM2-135M 3-4%
 * perplexity with either quantized kernel (benchmarks/llm/kernel_perplexity.json).
 * Tiles of several output rows share each activation load; with several activation rows
 * each weight load is reused across them (the compute-bound regime of a batch).
 *
 * AVX2 + FMA (+ F16C) paths under #ifdef __AVX2__, plain C otherwise; the int8 kernel at
 * several rows has an AVX-512 (VNNI + BW) path beside, with the same results, and the
 * int4 kernel one at every row count (its results differ from the AVX2 path's by float
 * rounding only: Intel Xeon, one core, SmolLM2-135M's layer shapes, 1.3x at one row
 * from cache, 1.6x at 4-128 rows). Single-threaded:
 * the engine measures its thread count, and these run as one of the timed candidates.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TI_AVX2 1
#include <immintrin.h>
#else
#define TI_AVX2 0
#endif
/* AVX-512 VNNI on 256-bit registers: the int8 kernel's multiply-add by the block
 * multipliers in one instruction. */
#if TI_AVX2 && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define TI_VNNI 1
#else
#define TI_VNNI 0
#endif
/* AVX-512 F + DQ: the fp32 kernel's several-row passes on 512-bit registers. */
#if TI_AVX2 && defined(__AVX512F__) && defined(__AVX512DQ__)
#define TI_F32Z 1
/* The f32 setting from which the several-row passes run on 512-bit registers. */
#define TI_F32Z_AHEAD_MIN 1024
#else
#define TI_F32Z 0
#endif

/* Software prefetch: how many bytes ahead of a weight stream the kernels ask for lines
 * (one per int8 block of 4 x 32 bytes, two per 80-byte int4 record, a 1 KiB AMX tile's
 * lines on its first pass). How far pays depends on the CPU: on Zen 5 the int8 kernel at
 * one row from memory ran 5-10% slower on the hardware prefetcher alone and slower again
 * 1 KiB ahead (us per call, none / 256 / 1024 bytes ahead: 3072x576 58.2 / 54.6 / 75.2;
 * 49152x576 1120 / 1006 / 1083), while on an Intel Xeon SmolLM2-135M's int4 layers at one
 * row ran 1.5x faster 4 KiB ahead than 256 bytes (6.6 against 10.0 ms for the 30
 * layers, one thread), its AMX int8 LM head fastest 1 KiB ahead (2.64 ms, 2.79 at 256,
 * 3.21 at 4 KiB). So the distance is a run-time setting per kernel family (int8, int4,
 * AMX, q8: ti_set_prefetch_for, the library's set_prefetch), 256 bytes unless set; a model's
 * load measures each family's on the model's own one-row products
 * (llm/backends/cpu/prefetch.py). The fp32 kernel's setting (f32) picks how it runs
 * several rows (ti_f32_linear), measured on the model's fp32 layers at several rows.
 * Set while no kernel runs. */
static int64_t prefetch_bytes[TI_PREFETCH_KINDS] = {256, 256, 256, 256, 256};

/* Every kind's distance; returns the int8 kernel's. Out of range: unchanged. */
int64_t ti_set_prefetch(int64_t bytes) {
    for (int kind = 0; kind < TI_PREFETCH_KINDS; kind++) ti_set_prefetch_for(kind, bytes);
    return prefetch_bytes[TI_PREFETCH_INT8];
}

/* One kernel family's distance (TI_PREFETCH_INT8 / _INT4 / _AMX / _Q8 / _F32); returns
 * it, -1 for an unknown kind. */
int64_t ti_set_prefetch_for(int kind, int64_t bytes) {
    if (kind < 0 || kind >= TI_PREFETCH_KINDS) return -1;
    if (bytes >= 0 && bytes <= (1 << 20)) prefetch_bytes[kind] = bytes;
    return prefetch_bytes[kind];
}

int64_t ti_prefetch_bytes(int kind) { return prefetch_bytes[kind]; }

#if TI_AVX2
#define PREFETCH(p) _mm_prefetch((const char *)(p) + pf, _MM_HINT_T0)
#else
#define PREFETCH(p) ((void)0)
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

/* The int8 kernel's activation blocks: per block of 32, an integer multiplier m in
 * 1..levels (0 for a block of zeros) of the row's scale amax / (127 * levels), at least the
 * block's own amax / 127: m = ceil(block amax * (levels / row amax)). The integer sums take m
 * in (vpmaddwd by m instead of by 1), so the arithmetic stays in integers to the end of the
 * row and one float scaling follows, as with one scale per row, while each block is rounded
 * on its own scale. A float scale per block (llama.cpp's Q8_0) would cost a conversion and
 * an FMA per block and output row; rounded to a multiple of the row's, it scored the same
 * (SmolLM2-135M, int8 weights, activations simulated in torch: 11.99 either way, 12.42 with
 * one scale per row; with levels 64, 11.97). An int32 lane gains at most
 * 4 * 127 * 127 * m per block: levels is what keeps kp / 32 blocks below 2^31. */
static int i8_levels(int64_t kp) {
    int64_t m = kp > 0 ? INT32_MAX / (4 * 127 * 127 * (kp / 32)) : 255;
    return m > 255 ? 255 : (int)m;
}

/* Per row: q[r, 0..kp) with zero padding past k, m[r, b] per block of 32 and the row's
 * scale[r] = amax / (127 * levels): x[r, i] ~ q[r, i] * m[r, i / 32] * scale[r]. */
static void quantize_blocks(const float *x, int64_t rows, int64_t k, int64_t kp, int levels,
                            int8_t *q, int16_t *m, float *scale) {
    const int64_t blocks = kp / 32;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * k;
        int8_t *qr = q + r * kp;
        int16_t *mr = m + r * blocks;
        float amax = 0.0f;
        for (int64_t b = 0; b < blocks; b++) {     /* each block's amax, in its first 4 bytes of q for now */
            int64_t len = k - 32 * b < 32 ? k - 32 * b : 32;
            float bmax = len > 0 ? abs_max(xr + 32 * b, len) : 0.0f;
            memcpy(q + r * kp + 32 * b, &bmax, sizeof bmax);
            amax = fmaxf(amax, bmax);
        }
        scale[r] = amax / (127.0f * (float)levels);
        float rel = amax > 0.0f ? (float)levels / amax : 0.0f;
        for (int64_t b = 0; b < blocks; b++) {
            int64_t len = k - 32 * b < 32 ? k - 32 * b : 32;
            float bmax, inv = 0.0f;
            memcpy(&bmax, qr + 32 * b, sizeof bmax);
            int mb = 0;
            if (bmax > 0.0f) {
                float c = ceilf(bmax * rel);
                mb = c < 1.0f ? 1 : c > (float)levels ? levels : (int)c;
                inv = 1.0f / (scale[r] * (float)mb);
            }
            mr[b] = (int16_t)mb;
            if (len > 0) quantize_span(xr + 32 * b, len, inv, qr + 32 * b);
        }
        memset(qr + k, 0, (size_t)(kp - k));
    }
}

/* The same quantization for amx.c's kernel (native.h). */
int ti_i8_levels(int64_t kp) { return i8_levels(kp); }

void ti_quantize_i8_blocks(const float *x, int64_t rows, int64_t k, int64_t kp, int levels,
                           int8_t *q, int16_t *m, float *scale) {
    quantize_blocks(x, rows, k, kp, levels, q, m, scale);
}

/* Per group of 32 (k a multiple of 32): q[r, 32g..32g+32) with scale dx[r, g] = the
 * group's amax / 127 and xsum[r, g] = dx[r, g] * the group's sum of q (the int4 kernel's
 * minimum term), as llama.cpp's Q8_1 activation blocks. */
static void quantize_groups(const float *x, int64_t rows, int64_t k, int8_t *q, float *dx,
                            float *xsum) {
    int64_t groups = k / 32;
    for (int64_t i = 0; i < rows * groups; i++) {
        float amax = abs_max(x + 32 * i, 32), inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        dx[i] = amax / 127.0f;
        xsum[i] = dx[i] * (float)quantize_span(x + 32 * i, 32, inv, q + 32 * i);
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

/* acc + m times the sum over 32 byte pairs of x * w, as 8 int32 lanes; ax = |x|, mv = m
 * in every int16 lane. With VNNI, vpdpwssd multiplies the int16 pair sums by m and adds
 * them in one instruction (the same integers: vpmaddwd + vpaddd, both wrapping). */
static inline __m256i mac_i8(__m256i acc, __m256i ax, __m256i x, __m256i w, __m256i mv) {
    __m256i pairs = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w, x));
#if TI_VNNI
    return _mm256_dpwssd_epi32(acc, pairs, mv);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, mv));
#endif
}
#endif

/* ---- int8 ------------------------------------------------------------------------ */

/* The weights come in tiles of 4 output rows (N padded with zero rows to a multiple of
 * 4), interleaved per 32 columns: tile t, column block b holds the 32 bytes of rows
 * 4t..4t+3 one after the other. A tile is then one sequential stream, which the
 * hardware prefetcher follows (four separate row streams measured half the bandwidth).
 * acc[r * 4 + j] = sum_k xq[r, k] * m[r, k / 32] * w[4t + j, k], over kp (a multiple of
 * 32): each of the 8 int32 lanes is exact, and the lanes are summed in float (their sum
 * may pass 2^31; i8_levels bounds one lane). */
#if TI_AVX2
static inline __m128 hsum4_f32(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

static inline __m128 hsum4_lanes(__m256i a, __m256i b, __m256i c, __m256i d) {
    return hsum4_f32(_mm256_cvtepi32_ps(a), _mm256_cvtepi32_ps(b), _mm256_cvtepi32_ps(c),
                     _mm256_cvtepi32_ps(d));
}

#define I8_TILE(RB)                                                                        \
    static void i8_tile_##RB(const int8_t *w, const int8_t *xq, const int16_t *m,          \
                             int64_t kp, float *acc) {                                     \
        const int64_t blocks = kp / 32, pf = prefetch_bytes[TI_PREFETCH_INT8];             \
        __m256i a[RB][4];                                                                  \
        for (int r = 0; r < RB; r++)                                                       \
            for (int j = 0; j < 4; j++) a[r][j] = _mm256_setzero_si256();                  \
        for (int64_t k = 0, b = 0; k < kp; k += 32, b++, w += 128) {                       \
            PREFETCH(w);                                                                   \
            __m256i wv[4];                                                                 \
            for (int j = 0; j < 4; j++) wv[j] = _mm256_loadu_si256((const __m256i *)(w + 32 * j)); \
            for (int r = 0; r < RB; r++) {                                                 \
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + r * kp + k));       \
                __m256i ax = _mm256_abs_epi8(xv);                                          \
                __m256i mv = _mm256_set1_epi16(m[r * blocks + b]);                         \
                for (int j = 0; j < 4; j++)                                                \
                    a[r][j] = mac_i8(a[r][j], ax, xv, wv[j], mv);                          \
            }                                                                              \
        }                                                                                  \
        for (int r = 0; r < RB; r++)                                                       \
            _mm_storeu_ps(acc + 4 * r, hsum4_lanes(a[r][0], a[r][1], a[r][2], a[r][3]));   \
    }
#else
#define I8_TILE(RB)                                                                        \
    static void i8_tile_##RB(const int8_t *w, const int8_t *xq, const int16_t *m,          \
                             int64_t kp, float *acc) {                                     \
        const int64_t blocks = kp / 32;                                                    \
        for (int r = 0; r < RB; r++)                                                       \
            for (int j = 0; j < 4; j++) {                                                  \
                int64_t s = 0;                                                             \
                for (int64_t k = 0; k < kp; k++)                                           \
                    s += (int64_t)xq[r * kp + k] * m[r * blocks + k / 32]                  \
                         * w[(k / 32) * 128 + j * 32 + k % 32];                            \
                acc[r * 4 + j] = (float)s;                                                 \
            }                                                                              \
    }
#endif

I8_TILE(1)
I8_TILE(2)

/* Many rows. The tile kernels above pay, per 32 products, vpsignb + vpmaddubsw +
 * vpmaddwd + vpaddd plus an |x| per activation load, and GCC spills one of their eight
 * accumulators; on Zen 3 that ran at 0.63 ns per 32 products at 16 rows, where fbgemm's
 * u8 x 7-bit kernel (no sign step) took 0.44-0.51. Here the activations are quantized
 * once per call into one stream per pair of rows that carries |x| beside x (no vpabsb in
 * the loop), and the loop over a tile's pairs of rows is written in assembly: 8
 * accumulators, 4 weight registers, |x| and two temporaries, the signed x read from
 * memory by vpsignb, nothing spilled. The sign trick stays (8-bit weights times 8-bit
 * activations cannot go through vpmaddubsw's unsigned operand without saturating), so
 * the products and int32 sums are exactly those of the one-row kernel. */
#if TI_AVX2 && defined(__GNUC__) && defined(__x86_64__)
#define TI_I8_MANY 1
#else
#define TI_I8_MANY 0
#endif

#if TI_I8_MANY
/* Rows per pass over the weights: 16 rows' streams (2 * 16 * kp bytes) stay in L1/L2
 * while each tile is read once per block. */
#define I8_ROW_BLOCK 16

/* Row r's stream starts at s + 3 * r * kp. Per 32 columns, a pair of rows (r even)
 * holds x[r], x[r + 1], |x[r]|, |x[r + 1]|, then the two rows' block multipliers m in
 * 16 int16 lanes each (192 bytes); a lone last row x, |x|, m (96). */
static void i8_streams(const int8_t *xq, const int16_t *m, int64_t rows, int64_t kp,
                       int8_t *s) {
    const int64_t blocks = kp / 32;
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        const int8_t *a = xq + r * kp, *b = a + kp;
        int8_t *o = s + 3 * r * kp;
        for (int64_t k = 0, i = 0; k < kp; k += 32, i++, o += 192) {
            __m256i va = _mm256_loadu_si256((const __m256i *)(a + k));
            __m256i vb = _mm256_loadu_si256((const __m256i *)(b + k));
            _mm256_storeu_si256((__m256i *)o, va);
            _mm256_storeu_si256((__m256i *)(o + 32), vb);
            _mm256_storeu_si256((__m256i *)(o + 64), _mm256_abs_epi8(va));
            _mm256_storeu_si256((__m256i *)(o + 96), _mm256_abs_epi8(vb));
            _mm256_storeu_si256((__m256i *)(o + 128), _mm256_set1_epi16(m[r * blocks + i]));
            _mm256_storeu_si256((__m256i *)(o + 160), _mm256_set1_epi16(m[(r + 1) * blocks + i]));
        }
    }
    if (r < rows) {
        const int8_t *a = xq + r * kp;
        int8_t *o = s + 3 * r * kp;
        for (int64_t k = 0, i = 0; k < kp; k += 32, i++, o += 96) {
            __m256i va = _mm256_loadu_si256((const __m256i *)(a + k));
            _mm256_storeu_si256((__m256i *)o, va);
            _mm256_storeu_si256((__m256i *)(o + 32), _mm256_abs_epi8(va));
            _mm256_storeu_si256((__m256i *)(o + 64), _mm256_set1_epi16(m[r * blocks + i]));
        }
    }
}

/* acc(ACC) += sum over pairs of |x| * (w(W) with the sign of x(X)), times the block's
 * multiplier; ymm12 holds |x|, ymm15 the multiplier (in a register, not read from memory
 * by each vpmaddwd: 16 rows then ran at 0.90x the per-row kernel instead of 0.93x). */
#if TI_VNNI
#define I8_MAC(X, W, T, ACC)                                                               \
    "vpsignb " X ", %%ymm" W ", %%ymm" T "\n\t"                                          \
    "vpmaddubsw %%ymm" T ", %%ymm12, %%ymm" T "\n\t"                                     \
    "vpdpwssd %%ymm15, %%ymm" T ", %%ymm" ACC "\n\t"
#else
#define I8_MAC(X, W, T, ACC)                                                               \
    "vpsignb " X ", %%ymm" W ", %%ymm" T "\n\t"                                          \
    "vpmaddubsw %%ymm" T ", %%ymm12, %%ymm" T "\n\t"                                     \
    "vpmaddwd %%ymm15, %%ymm" T ", %%ymm" T "\n\t"                                       \
    "vpaddd %%ymm" T ", %%ymm" ACC ", %%ymm" ACC "\n\t"
#endif

/* pairs (>= 1) pairs of rows, streams from s, over one tile (kp >= 32): per pair, the
 * 8 sums (row r's 4 output rows, then row r + 1's) to acc. While it runs, the next tile
 * (4 * kp bytes on) is prefetched at the same offset: the hardware prefetcher alone left
 * a pair's first pass over a tile waiting on memory (1.2x slower with the weights out of
 * cache). */
static void i8_pairs(const int8_t *tile, const int8_t *s, int64_t kp, int64_t pairs,
                     __m256 *acc) {
    const int8_t *w = tile, *tile_end = tile + 4 * kp, *s_end = s + 6 * kp * pairs;
    __asm__ volatile(
        "2:\n\t"
        "mov %[tile], %[w]\n\t"
        "vpxor %%xmm0, %%xmm0, %%xmm0\n\t"
        "vpxor %%xmm1, %%xmm1, %%xmm1\n\t"
        "vpxor %%xmm2, %%xmm2, %%xmm2\n\t"
        "vpxor %%xmm3, %%xmm3, %%xmm3\n\t"
        "vpxor %%xmm4, %%xmm4, %%xmm4\n\t"
        "vpxor %%xmm5, %%xmm5, %%xmm5\n\t"
        "vpxor %%xmm6, %%xmm6, %%xmm6\n\t"
        "vpxor %%xmm7, %%xmm7, %%xmm7\n\t"
        ".p2align 5\n\t"
        "1:\n\t"
        "prefetcht0 (%[w], %[next])\n\t"
        "prefetcht0 64(%[w], %[next])\n\t"
        "vmovdqu (%[w]), %%ymm8\n\t"
        "vmovdqu 32(%[w]), %%ymm9\n\t"
        "vmovdqu 64(%[w]), %%ymm10\n\t"
        "vmovdqu 96(%[w]), %%ymm11\n\t"
        "vmovdqu 64(%[s]), %%ymm12\n\t"
        "vmovdqu 128(%[s]), %%ymm15\n\t"
        I8_MAC("(%[s])", "8", "13", "0")
        I8_MAC("(%[s])", "9", "14", "1")
        I8_MAC("(%[s])", "10", "13", "2")
        I8_MAC("(%[s])", "11", "14", "3")
        "vmovdqu 96(%[s]), %%ymm12\n\t"
        "vmovdqu 160(%[s]), %%ymm15\n\t"
        I8_MAC("32(%[s])", "8", "13", "4")
        I8_MAC("32(%[s])", "9", "14", "5")
        I8_MAC("32(%[s])", "10", "13", "6")
        I8_MAC("32(%[s])", "11", "14", "7")
        "add $128, %[w]\n\t"
        "add $192, %[s]\n\t"
        "cmp %[tile_end], %[w]\n\t"
        "jb 1b\n\t"
        /* Each accumulator's 8 lanes in float, summed as hsum4_lanes sums them:
         * [r: j0..j3 | r + 1: j0..j3]. */
        "vcvtdq2ps %%ymm0, %%ymm0\n\t"
        "vcvtdq2ps %%ymm1, %%ymm1\n\t"
        "vcvtdq2ps %%ymm2, %%ymm2\n\t"
        "vcvtdq2ps %%ymm3, %%ymm3\n\t"
        "vcvtdq2ps %%ymm4, %%ymm4\n\t"
        "vcvtdq2ps %%ymm5, %%ymm5\n\t"
        "vcvtdq2ps %%ymm6, %%ymm6\n\t"
        "vcvtdq2ps %%ymm7, %%ymm7\n\t"
        "vhaddps %%ymm1, %%ymm0, %%ymm0\n\t"
        "vhaddps %%ymm3, %%ymm2, %%ymm2\n\t"
        "vhaddps %%ymm5, %%ymm4, %%ymm4\n\t"
        "vhaddps %%ymm7, %%ymm6, %%ymm6\n\t"
        "vhaddps %%ymm2, %%ymm0, %%ymm0\n\t"
        "vhaddps %%ymm6, %%ymm4, %%ymm4\n\t"
        "vperm2f128 $0x20, %%ymm4, %%ymm0, %%ymm1\n\t"
        "vperm2f128 $0x31, %%ymm4, %%ymm0, %%ymm2\n\t"
        "vaddps %%ymm2, %%ymm1, %%ymm1\n\t"
        "vmovups %%ymm1, (%[acc])\n\t"
        "add $32, %[acc]\n\t"
        "cmp %[s_end], %[s]\n\t"
        "jb 2b\n\t"
        : [w] "+&r"(w), [s] "+&r"(s), [acc] "+&r"(acc)
        : [tile] "r"(tile), [tile_end] "r"(tile_end), [s_end] "r"(s_end), [next] "r"(4 * kp)
        : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
          "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
}

/* A lone row over one tile (its stream: x, |x|, m per 32 columns). */
static __m128 i8_lone(const int8_t *w, const int8_t *s, int64_t kp) {
    __m256i a[4];
    for (int j = 0; j < 4; j++) a[j] = _mm256_setzero_si256();
    for (int64_t k = 0; k < kp; k += 32, w += 128, s += 96) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)s);
        __m256i ax = _mm256_loadu_si256((const __m256i *)(s + 32));
        __m256i mv = _mm256_loadu_si256((const __m256i *)(s + 64));
        for (int j = 0; j < 4; j++)
            a[j] = mac_i8(a[j], ax, xv, _mm256_loadu_si256((const __m256i *)(w + 32 * j)), mv);
    }
    return hsum4_lanes(a[0], a[1], a[2], a[3]);
}

/* y[r, t..t+nb) = acc * wscale * xs[r], the one-row path's float operations in its
 * order (so a row's outputs do not depend on how many rows came with it). */
static inline void i8_scale4(__m128 acc, const float *wscale, float xs, int nb, float *y) {
    float a[4];
    _mm_storeu_ps(a, acc);
    for (int j = 0; j < nb; j++) y[j] = a[j] * wscale[j] * xs;
}

/* rows >= 2, kp >= 32. */
static int i8_many(const float *x, int64_t rows, int64_t k, const int8_t *w,
                   const float *wscale, int64_t n, int64_t kp, float *y) {
    /* xq (rows * kp), the streams (3 * rows * kp), the row scales, the block multipliers;
     * 64-byte aligned. */
    const int64_t blocks = kp / 32;
    size_t bytes = (size_t)(4 * rows * kp) + (size_t)rows * sizeof(float)
                   + (size_t)(rows * blocks) * sizeof(int16_t);
    int8_t *xq = (int8_t *)aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!xq) return -1;
    int8_t *streams = xq + rows * kp;
    float *xs = (float *)(streams + 3 * rows * kp);
    int16_t *m = (int16_t *)(xs + rows);
    quantize_blocks(x, rows, k, kp, i8_levels(kp), xq, m, xs);
    i8_streams(xq, m, rows, kp, streams);
    __m256 acc[I8_ROW_BLOCK / 2];
    for (int64_t r0 = 0; r0 < rows; r0 += I8_ROW_BLOCK) {
        int64_t block = rows - r0 < I8_ROW_BLOCK ? rows - r0 : I8_ROW_BLOCK, pairs = block / 2;
        const int8_t *s = streams + 3 * r0 * kp;
        __m256 xs2[I8_ROW_BLOCK / 2];     /* [xs[r] x 4 | xs[r + 1] x 4] per pair */
        for (int64_t p = 0; p < pairs; p++)
            xs2[p] = _mm256_set_m128(_mm_set1_ps(xs[r0 + 2 * p + 1]), _mm_set1_ps(xs[r0 + 2 * p]));
        for (int64_t t = 0; t < n; t += 4) {
            const int8_t *tile = w + t * kp;
            int nb = n - t < 4 ? (int)(n - t) : 4;
            if (pairs) i8_pairs(tile, s, kp, pairs, acc);
            if (nb == 4) {
                __m256 ws = _mm256_broadcast_ps((const __m128 *)(wscale + t));
                for (int64_t p = 0; p < pairs; p++) {
                    float *yr = y + (r0 + 2 * p) * n + t;
                    __m256 v = _mm256_mul_ps(_mm256_mul_ps(acc[p], ws), xs2[p]);
                    _mm_storeu_ps(yr, _mm256_castps256_ps128(v));
                    _mm_storeu_ps(yr + n, _mm256_extractf128_ps(v, 1));
                }
            } else {
                for (int64_t p = 0; p < pairs; p++) {
                    int64_t r = r0 + 2 * p;
                    i8_scale4(_mm256_castps256_ps128(acc[p]), wscale + t, xs[r], nb, y + r * n + t);
                    i8_scale4(_mm256_extractf128_ps(acc[p], 1), wscale + t, xs[r + 1], nb,
                              y + (r + 1) * n + t);
                }
            }
            if (block & 1) {
                int64_t r = r0 + block - 1;
                i8_scale4(i8_lone(tile, streams + 3 * r * kp, kp), wscale + t, xs[r], nb,
                          y + r * n + t);
            }
        }
    }
    free(xq);
    return 0;
}
#endif

/* Many rows on AVX-512 VNNI + BW. vpsignb has no 512-bit form, and the block multipliers
 * m need 16 bits beside the 8 of x; so each activation goes in as the int16 x * m
 * (|x * m| <= 127 * 255 = 32385) and each weight as int16 (vpmovsxbw, once per group of
 * rows and block), and one vpdpwssd on 512-bit registers does the 32 products of a block
 * of 32 columns and their sums in pairs: int32 lane i holds columns 2i and 2i + 1, where
 * the one-row kernel's lane i holds 4i..4i + 3 (vpmaddubsw's pair, then vpmaddwd's). At
 * the end each pair of lanes is added in int32 (exact: i8_levels bounds the one-row
 * kernel's lane, and the wrapping sums are exact mod 2^32 anyway), which gives that
 * kernel's 8 integers per output, summed in float in its order (hsum4_lanes), then
 * scaled in its order: a row's outputs do not depend on the rows beside it or on this
 * path. Per 32 products: one vpdpwssd, against the AVX2 path's vpsignb + vpmaddubsw +
 * vpdpwssd on half the width. */
#ifndef TI_I8_ZMM       /* -DTI_I8_ZMM=0: the AVX2 path above on such a CPU too */
#if TI_I8_MANY && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define TI_I8_ZMM 1
#else
#define TI_I8_ZMM 0
#endif
#endif

#if TI_I8_ZMM
/* Rows per pass over the weights: their int16 activations (2 * kp bytes per row) stay in
 * L1/L2 while each tile of 4 output rows meets every one of them. */
#define I8Z_ROW_BLOCK 16
/* Rows per pass over a tile: 4 * G accumulators, 4 weight registers, x (6 rows, 29
 * registers, measured no faster than 4). */
#define I8Z_GROUP_MAX 4
/* Below this kp the AVX2 path is faster: each pass over a tile ends in 16 accumulators'
 * lanes folded and summed, which short rows do not amortize (Zen 4, one thread, weights
 * in cache, G multiply-adds/s, AVX2 / this at 16 rows: kp 256 70 / 66, 384 73 / 80,
 * 576 74 / 88, 1536 75 / 101). */
#define I8Z_MIN_KP 384

/* The one-row kernel's 8 int32 sums from the 16 lanes of pairs: lanes 2i and 2i + 1
 * added (in the low half of each 64-bit lane). */
static inline __m256i i8z_fold(__m512i z) {
    return _mm512_cvtepi64_epi32(_mm512_add_epi64(z, _mm512_srli_epi64(z, 32)));
}

/* acc + vpdpwssd(x, w), the accumulator tied to its register: GCC's intrinsic copied
 * every accumulator to another register and back around each vpdpwssd. */
static inline __m512i i8z_dp(__m512i acc, __m512i x, __m512i w) {
    __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(w));
    return acc;
}

/* G rows (xm: G rows of kp int16, stride kp) against one tile of 4 output rows (w, its
 * interleaved int8 layout): the sums to acc[g], as i8_lone's. */
static inline __attribute__((always_inline)) void i8z_group(const int8_t *w, const int16_t *xm,
                                                           int64_t kp, int G, __m128 *acc,
                                                           const int8_t *next) {
    __m512i a[I8Z_GROUP_MAX][4];
    for (int g = 0; g < G; g++)
        for (int j = 0; j < 4; j++) a[g][j] = _mm512_setzero_si512();
    for (int64_t k = 0; k < kp; k += 32, w += 128) {
        if (next) {
            _mm_prefetch((const char *)next + 4 * k, _MM_HINT_T0);
            _mm_prefetch((const char *)next + 4 * k + 64, _MM_HINT_T0);
        }
        __m512i wv[4];
        for (int j = 0; j < 4; j++)
            wv[j] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w + 32 * j)));
        for (int g = 0; g < G; g++) {
            __m512i xv = _mm512_loadu_si512((const void *)(xm + g * kp + k));
            for (int j = 0; j < 4; j++) a[g][j] = i8z_dp(a[g][j], xv, wv[j]);
        }
    }
    for (int g = 0; g < G; g++)
        acc[g] = hsum4_lanes(i8z_fold(a[g][0]), i8z_fold(a[g][1]), i8z_fold(a[g][2]),
                             i8z_fold(a[g][3]));
}

#define I8Z_GROUP(G)                                                                       \
    static void i8z_group_##G(const int8_t *w, const int16_t *xm, int64_t kp, __m128 *acc, \
                              const int8_t *next) {                                        \
        i8z_group(w, xm, kp, G, acc, next);                                                \
    }
I8Z_GROUP(1)
I8Z_GROUP(2)
I8Z_GROUP(3)
I8Z_GROUP(4)

/* rows >= 2, kp >= 32 (a multiple of 32). */
static int i8z_many(const float *x, int64_t rows, int64_t k, const int8_t *w,
                    const float *wscale, int64_t n, int64_t kp, float *y) {
    /* xm (rows * kp int16), xq (rows * kp), the block multipliers, the row scales;
     * 64-byte aligned. */
    const int64_t blocks = kp / 32;
    size_t bytes = (size_t)(3 * rows * kp) + (size_t)(rows * blocks) * sizeof(int16_t)
                   + (size_t)rows * sizeof(float);
    int16_t *xm = (int16_t *)aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!xm) return -1;
    int8_t *xq = (int8_t *)(xm + rows * kp);
    int16_t *m = (int16_t *)(xq + rows * kp);
    float *xs = (float *)(m + rows * blocks);
    quantize_blocks(x, rows, k, kp, i8_levels(kp), xq, m, xs);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < blocks; b++) {
            const int8_t *q8 = xq + r * kp + 32 * b;
            __m512i q = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)q8));
            _mm512_storeu_si512((void *)(xm + r * kp + 32 * b),
                                _mm512_mullo_epi16(q, _mm512_set1_epi16(m[r * blocks + b])));
        }
    __m128 acc[I8Z_GROUP_MAX];
    for (int64_t r0 = 0; r0 < rows; r0 += I8Z_ROW_BLOCK) {
        int64_t r1 = rows - r0 < I8Z_ROW_BLOCK ? rows : r0 + I8Z_ROW_BLOCK;
        for (int64_t t = 0; t < n; t += 4) {
            const int8_t *tile = w + t * kp;
            int nb = n - t < 4 ? (int)(n - t) : 4;
            __m128 ws = nb == 4 ? _mm_loadu_ps(wscale + t) : _mm_setzero_ps();
            for (int64_t r = r0; r < r1;) {
                /* the rows left in groups of at most I8Z_GROUP_MAX, as even as they go */
                int left = (int)(r1 - r), parts = (left + I8Z_GROUP_MAX - 1) / I8Z_GROUP_MAX;
                int g = (left + parts - 1) / parts;
                const int16_t *xr = xm + r * kp;
                const int8_t *next = r == r0 ? tile + 4 * kp : NULL;
                switch (g) {
                case 4: i8z_group_4(tile, xr, kp, acc, next); break;
                case 3: i8z_group_3(tile, xr, kp, acc, next); break;
                case 2: i8z_group_2(tile, xr, kp, acc, next); break;
                default: i8z_group_1(tile, xr, kp, acc, next); break;
                }
                for (int i = 0; i < g; i++) {
                    if (nb == 4)
                        _mm_storeu_ps(y + (r + i) * n + t,
                                      _mm_mul_ps(_mm_mul_ps(acc[i], ws), _mm_set1_ps(xs[r + i])));
                    else
                        i8_scale4(acc[i], wscale + t, xs[r + i], nb, y + (r + i) * n + t);
                }
                r += g;
            }
        }
    }
    free(xm);
    return 0;
}
#endif

int ti_int8_linear(const float *x, int64_t rows, int64_t k, const int8_t *w,
                   const float *wscale, const float *bias, int64_t n, int64_t kp, float *y) {
    if (i8_levels(kp) < 1) return -2;       /* kp past 2^20: an int32 lane could overflow */
#if TI_I8_MANY
    if (rows > 1 && kp > 0) {
#if TI_I8_ZMM
        if (kp >= I8Z_MIN_KP ? i8z_many(x, rows, k, w, wscale, n, kp, y)
                             : i8_many(x, rows, k, w, wscale, n, kp, y))
            return -1;
#else
        if (i8_many(x, rows, k, w, wscale, n, kp, y)) return -1;
#endif
        if (bias)
            for (int64_t r = 0; r < rows; r++)
                for (int64_t j = 0; j < n; j++) y[r * n + j] += bias[j];
        return 0;
    }
#endif
    const int64_t blocks = kp / 32;
    int8_t *xq = (int8_t *)malloc((size_t)(rows * kp) + (size_t)rows * sizeof(float)
                                  + (size_t)(rows * blocks) * sizeof(int16_t));
    if (!xq) return -1;
    float *xs = (float *)(xq + rows * kp);   /* rows * kp is a multiple of 32: aligned */
    int16_t *m = (int16_t *)(xs + rows);
    quantize_blocks(x, rows, k, kp, i8_levels(kp), xq, m, xs);
    float acc[8];
    /* Tile outside, activation rows inside: a tile's weights stay in L1 while every
     * activation row passes over them. Two rows per pass: 8 accumulators, and widening
     * to int16 for vpmaddwd instead of the sign trick measured 1.4x slower. */
    for (int64_t t = 0; t < n; t += 4) {
        const int8_t *wt = w + t * kp;
        int nb = n - t < 4 ? (int)(n - t) : 4;
        int64_t r = 0;
        for (; r + 2 <= rows; r += 2) {
            i8_tile_2(wt, xq + r * kp, m + r * blocks, kp, acc);
            for (int a = 0; a < 2; a++)
                for (int j = 0; j < nb; j++)
                    y[(r + a) * n + t + j] = acc[4 * a + j] * wscale[t + j] * xs[r + a];
        }
        for (; r < rows; r++) {
            i8_tile_1(wt, xq + r * kp, m + r * blocks, kp, acc);
            for (int j = 0; j < nb; j++) y[r * n + t + j] = acc[j] * wscale[t + j] * xs[r];
        }
    }
    if (bias)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < n; j++) y[r * n + j] += bias[j];
    free(xq);
    return 0;
}

/* ---- int4 ------------------------------------------------------------------------ */

/* Tiles of 4 output rows again; for each group of 32 columns a tile holds an 80-byte
 * record: the 4 rows' 16 nibble bytes (byte i: q[i] low, q[i + 16] high), then their 4
 * fp16 scales, then their 4 fp16 minimums. Two rows' nibbles fill one 256-bit register;
 * the low nibbles meet the group's first 16 activations broadcast to both halves, the
 * high nibbles the last 16, so no shuffle is needed. The activations have one scale per
 * group of 32 too (dx), folded into the weights' scales: a group costs one
 * int-to-float conversion, one multiply and one FMA per 4 output rows.
 * out[r * 4 + j] = y[r, 4t + j] before the bias. */
#define I4_RECORD 80
#if TI_AVX2
#define I4_PREFETCH(p) (_mm_prefetch((const char *)(p) + pf, _MM_HINT_T0),                  \
                        _mm_prefetch((const char *)(p) + pf + 64, _MM_HINT_T0))
#else
#define I4_PREFETCH(p) ((void)0)
#endif
#if TI_AVX2
#define I4_TILE(RB)                                                                        \
    static void i4_tile_##RB(const uint8_t *w, const int8_t *xq, const float *dx,          \
                             const float *xsum, int64_t k, float *out) {                   \
        const int64_t groups = k / 32, pf = prefetch_bytes[TI_PREFETCH_INT4];              \
        const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0f);           \
        const __m256i spread = _mm256_setr_epi32(0, 0, 2, 2, 1, 1, 3, 3);                 \
        __m256 a[RB];                                                                      \
        __m128 am[RB];                                                                     \
        for (int r = 0; r < RB; r++) {                                                     \
            a[r] = _mm256_setzero_ps();                                                    \
            am[r] = _mm_setzero_ps();                                                      \
        }                                                                                  \
        for (int64_t g = 0; g < groups; g++, w += I4_RECORD) {                             \
            I4_PREFETCH(w);                                                                \
            __m256i n01 = _mm256_loadu_si256((const __m256i *)w);                          \
            __m256i n23 = _mm256_loadu_si256((const __m256i *)(w + 32));                   \
            __m256i lo01 = _mm256_and_si256(n01, low);                                     \
            __m256i hi01 = _mm256_and_si256(_mm256_srli_epi16(n01, 4), low);               \
            __m256i lo23 = _mm256_and_si256(n23, low);                                     \
            __m256i hi23 = _mm256_and_si256(_mm256_srli_epi16(n23, 4), low);               \
            __m128 sc = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(w + 64)));          \
            __m128 mn = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(w + 72)));          \
            /* [s0 s0 s2 s2 | s1 s1 s3 s3], the order of the hadd below */                  \
            __m256 s = _mm256_permutevar8x32_ps(_mm256_set_m128(sc, sc), spread);          \
            for (int r = 0; r < RB; r++) {                                                 \
                const int8_t *xg = xq + r * k + 32 * g;                                    \
                __m256i xlo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)xg)); \
                __m256i xhi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xg + 16))); \
                __m256i p01 = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo01, xlo), \
                                                                 _mm256_maddubs_epi16(hi01, xhi)), ones); \
                __m256i p23 = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo23, xlo), \
                                                                 _mm256_maddubs_epi16(hi23, xhi)), ones); \
                __m256i h = _mm256_hadd_epi32(p01, p23);  /* [r0 r0 r2 r2 | r1 r1 r3 r3] */  \
                __m256 sd = _mm256_mul_ps(s, _mm256_broadcast_ss(dx + r * groups + g));    \
                a[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), sd, a[r]);                   \
                am[r] = _mm_fmadd_ps(mn, _mm_broadcast_ss(xsum + r * groups + g), am[r]);   \
            }                                                                              \
        }                                                                                  \
        for (int r = 0; r < RB; r++) {                                                     \
            __m128 t = _mm_hadd_ps(_mm256_castps256_ps128(a[r]), _mm256_extractf128_ps(a[r], 1)); \
            t = _mm_shuffle_ps(t, t, _MM_SHUFFLE(3, 1, 2, 0));   /* r0 r1 r2 r3 */          \
            _mm_storeu_ps(out + 4 * r, _mm_add_ps(t, am[r]));                              \
        }                                                                                  \
    }
#else
#define I4_TILE(RB)                                                                        \
    static void i4_tile_##RB(const uint8_t *w, const int8_t *xq, const float *dx,          \
                             const float *xsum, int64_t k, float *out) {                   \
        const int64_t groups = k / 32;                                                     \
        for (int r = 0; r < RB; r++)                                                       \
            for (int j = 0; j < 4; j++) {                                                  \
                float v = 0.0f;                                                            \
                for (int64_t g = 0; g < groups; g++) {                                     \
                    const uint8_t *rec = w + g * I4_RECORD, *p = rec + 16 * j;             \
                    const int8_t *xv = xq + r * k + g * 32;                                \
                    int32_t s = 0;                                                         \
                    for (int i = 0; i < 16; i++)                                           \
                        s += (p[i] & 0x0f) * xv[i] + (p[i] >> 4) * xv[i + 16];             \
                    uint16_t sc, mn;                                                       \
                    memcpy(&sc, rec + 64 + 2 * j, 2);                                      \
                    memcpy(&mn, rec + 72 + 2 * j, 2);                                      \
                    v += half_to_float(sc) * dx[r * groups + g] * (float)s                \
                         + half_to_float(mn) * xsum[r * groups + g];                       \
                }                                                                          \
                out[r * 4 + j] = v;                                                        \
            }                                                                              \
    }
#endif

I4_TILE(1)
I4_TILE(2)

/* The same records on AVX-512 VNNI + BW: a tile's 4 rows of nibbles are one 512-bit
 * load (row j in 128-bit lane j), the group's 16 + 16 activations are broadcast to all
 * four lanes, and two vpdpbusd (unsigned nibbles times signed activations, 4 products
 * per int32 lane) give each row's sum as 4 lanes, against the AVX2 path's 4 vpmaddubsw,
 * an add, 2 vpmaddwd and a hadd per 2 rows. Each row's lanes are scaled by its s * dx
 * per group (the scales spread to their lanes by one permute) and summed once at the
 * end; a row's outputs do not depend on the rows computed beside it. */
#ifndef TI_I4_ZMM       /* -DTI_I4_ZMM=0: the AVX2 path on such a CPU too */
#if TI_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define TI_I4_ZMM 1
#else
#define TI_I4_ZMM 0
#endif
#endif

#if TI_I4_ZMM
/* Row j's total: the sum of lanes 4j..4j+3, for j = 0..3, in one 128-bit vector. */
static inline __m128 i4z_rows(__m512 a) {
    __m128 v0 = _mm512_castps512_ps128(a), v1 = _mm512_extractf32x4_ps(a, 1);
    __m128 v2 = _mm512_extractf32x4_ps(a, 2), v3 = _mm512_extractf32x4_ps(a, 3);
    return _mm_hadd_ps(_mm_hadd_ps(v0, v1), _mm_hadd_ps(v2, v3));
}

/* One group's products for RB rows into accumulators A (lanes) and AM (minimums). */
#define I4Z_GROUP(RB, A, AM)                                                               \
    do {                                                                                   \
        I4_PREFETCH(w);                                                                    \
        __m512i nib = _mm512_loadu_si512((const void *)w);                                 \
        __m512i lo = _mm512_and_si512(nib, low);                                           \
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(nib, 4), low);                     \
        __m128 sc = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(w + 64)));              \
        __m128 mn = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(w + 72)));              \
        __m512 s = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(sc));              \
        for (int r = 0; r < RB; r++) {                                                     \
            const int8_t *xg = xq + r * k + 32 * g;                                        \
            __m512i xlo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)xg));    \
            __m512i xhi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xg + 16))); \
            __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xlo);              \
            p = _mm512_dpbusd_epi32(p, hi, xhi);                                           \
            __m512 sd = _mm512_mul_ps(s, _mm512_set1_ps(dx[r * groups + g]));              \
            A[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sd, A[r]);                       \
            AM[r] = _mm_fmadd_ps(mn, _mm_set1_ps(xsum[r * groups + g]), AM[r]);            \
        }                                                                                  \
    } while (0)

/* Even and odd groups in separate accumulators: at one row the loop is otherwise one
 * chain of dependent FMAs (4 cycles each) per tile. */
#define I4Z_TILE(RB)                                                                       \
    static void i4z_tile_##RB(const uint8_t *w, const int8_t *xq, const float *dx,         \
                              const float *xsum, int64_t k, float *out) {                  \
        const int64_t groups = k / 32, pf = prefetch_bytes[TI_PREFETCH_INT4];              \
        const __m512i low = _mm512_set1_epi8(0x0f);                                        \
        const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1,                   \
                                                 2, 2, 2, 2, 3, 3, 3, 3);                  \
        __m512 a[RB], b[RB];                                                               \
        __m128 am[RB], bm[RB];                                                             \
        for (int r = 0; r < RB; r++) {                                                     \
            a[r] = b[r] = _mm512_setzero_ps();                                             \
            am[r] = bm[r] = _mm_setzero_ps();                                              \
        }                                                                                  \
        int64_t g = 0;                                                                     \
        for (; g + 2 <= groups; g++, w += I4_RECORD) {                                     \
            I4Z_GROUP(RB, a, am);                                                          \
            g++, w += I4_RECORD;                                                           \
            I4Z_GROUP(RB, b, bm);                                                          \
        }                                                                                  \
        if (g < groups) I4Z_GROUP(RB, a, am);                                              \
        for (int r = 0; r < RB; r++)                                                       \
            _mm_storeu_ps(out + 4 * r, _mm_add_ps(i4z_rows(_mm512_add_ps(a[r], b[r])),     \
                                                  _mm_add_ps(am[r], bm[r])));              \
    }

I4Z_TILE(1)
I4Z_TILE(2)
I4Z_TILE(4)
#endif

/* The int4 and q8 kernels' driver (k a multiple of 32; w holds ceil(n / 4) tiles of k / 32
 * records of RECORD bytes): the activations quantized per group of 32 once, then every
 * tile in passes of 4, 2 and 1 rows (AVX-512), 2 and 1 (AVX2 or plain C), each pass's
 * rows storing their nb outputs. */
#define GROUP_PASSES(TILE, RB)                                                             \
    for (; r + RB <= rows; r += RB) {                                                      \
        TILE(wt, xq + r * k, dx + r * groups, xsum + r * groups, k, acc);                  \
        for (int a = 0; a < RB; a++)                                                       \
            for (int j = 0; j < nb; j++) y[(r + a) * n + t + j] = acc[4 * a + j];          \
    }
#if TI_I4_ZMM
#define ZMM_PASSES(P)                                                                      \
    GROUP_PASSES(P##z_tile_4, 4) GROUP_PASSES(P##z_tile_2, 2) GROUP_PASSES(P##z_tile_1, 1)
#else
#define ZMM_PASSES(P)
#endif
#define GROUPED_LINEAR(NAME, WTYPE, RECORD, P)                                             \
    int NAME(const float *x, int64_t rows, int64_t k, const WTYPE *w, const float *bias,   \
             int64_t n, float *y) {                                                        \
        const int64_t groups = k / 32;                                                     \
        float *dx = (float *)malloc((size_t)(2 * rows * groups) * sizeof(float)            \
                                    + (size_t)(rows * k));                                 \
        if (!dx) return -1;                                                                \
        float *xsum = dx + rows * groups;                                                  \
        int8_t *xq = (int8_t *)(xsum + rows * groups);                                     \
        quantize_groups(x, rows, k, xq, dx, xsum);                                         \
        float acc[16];                                                                     \
        for (int64_t t = 0; t < n; t += 4) {                                               \
            const WTYPE *wt = w + (t / 4) * groups * RECORD;                               \
            int nb = n - t < 4 ? (int)(n - t) : 4;                                         \
            int64_t r = 0;                                                                 \
            ZMM_PASSES(P)                                                                  \
            GROUP_PASSES(P##_tile_2, 2)                                                    \
            GROUP_PASSES(P##_tile_1, 1)                                                    \
        }                                                                                  \
        if (bias)                                                                          \
            for (int64_t r = 0; r < rows; r++)                                             \
                for (int64_t j = 0; j < n; j++) y[r * n + j] += bias[j];                   \
        free(dx);                                                                          \
        return 0;                                                                          \
    }

GROUPED_LINEAR(ti_int4_linear, uint8_t, I4_RECORD, i4)

/* ---- q8: int8 in blocks of 32 (llama.cpp's Q8_0) ---------------------------------- */

/* Tiles of 4 output rows; for each group of 32 columns a tile holds a 136-byte record:
 * the 4 rows' 32 int8 weights (row j at byte 32 j), then their 4 fp16 scales (the
 * Q8_0 block's d: w = d q). The activations are quantized per group of 32 as for int4
 * (dx, xsum). One scale per block instead of per output channel, as the int8 kernel
 * has: on SmolLM2-135M per-channel int8 weights scored a perplexity of 11.945 against
 * 11.893 per block of 32 (fp32 11.883). out[r * 4 + j] = y[r, 4t + j] before the bias. */
#define Q8_RECORD 136
#if TI_AVX2
#define Q8_PREFETCH(p) (_mm_prefetch((const char *)(p) + pf, _MM_HINT_T0),                  \
                        _mm_prefetch((const char *)(p) + pf + 64, _MM_HINT_T0),             \
                        _mm_prefetch((const char *)(p) + pf + 128, _MM_HINT_T0))
/* Signed weights times signed activations by vpmaddubsw on |w| and x carrying w's sign
 * (pairs of products stay within int16: 2 * 127 * 127); the 4 rows' sums end in lanes
 * [r0 r1 r2 r3 | r0 r1 r2 r3] (halves of each row's sum), scaled per group by d * dx. */
#define Q8_TILE(RB)                                                                        \
    static void q8_tile_##RB(const int8_t *w, const int8_t *xq, const float *dx,           \
                             const float *xsum, int64_t k, float *out) {                   \
        (void)xsum;                                                                        \
        const int64_t groups = k / 32, pf = prefetch_bytes[TI_PREFETCH_Q8];                \
        const __m256i ones = _mm256_set1_epi16(1);                                         \
        __m256 a[RB];                                                                      \
        for (int r = 0; r < RB; r++) a[r] = _mm256_setzero_ps();                           \
        for (int64_t g = 0; g < groups; g++, w += Q8_RECORD) {                             \
            Q8_PREFETCH(w);                                                                \
            __m256i w0 = _mm256_loadu_si256((const __m256i *)w);                           \
            __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + 32));                    \
            __m256i w2 = _mm256_loadu_si256((const __m256i *)(w + 64));                    \
            __m256i w3 = _mm256_loadu_si256((const __m256i *)(w + 96));                    \
            __m256i u0 = _mm256_abs_epi8(w0), u1 = _mm256_abs_epi8(w1);                    \
            __m256i u2 = _mm256_abs_epi8(w2), u3 = _mm256_abs_epi8(w3);                    \
            __m128 sc = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(w + 128)));         \
            __m256 s = _mm256_set_m128(sc, sc);                                            \
            for (int r = 0; r < RB; r++) {                                                 \
                __m256i x = _mm256_loadu_si256((const __m256i *)(xq + r * k + 32 * g));    \
                __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(u0, _mm256_sign_epi8(x, w0)), ones); \
                __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(u1, _mm256_sign_epi8(x, w1)), ones); \
                __m256i p2 = _mm256_madd_epi16(_mm256_maddubs_epi16(u2, _mm256_sign_epi8(x, w2)), ones); \
                __m256i p3 = _mm256_madd_epi16(_mm256_maddubs_epi16(u3, _mm256_sign_epi8(x, w3)), ones); \
                __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3)); \
                __m256 sd = _mm256_mul_ps(s, _mm256_broadcast_ss(dx + r * groups + g));    \
                a[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), sd, a[r]);                   \
            }                                                                              \
        }                                                                                  \
        for (int r = 0; r < RB; r++)                                                       \
            _mm_storeu_ps(out + 4 * r, _mm_add_ps(_mm256_castps256_ps128(a[r]),            \
                                                  _mm256_extractf128_ps(a[r], 1)));        \
    }
#else
#define Q8_TILE(RB)                                                                        \
    static void q8_tile_##RB(const int8_t *w, const int8_t *xq, const float *dx,           \
                             const float *xsum, int64_t k, float *out) {                   \
        (void)xsum;                                                                        \
        const int64_t groups = k / 32;                                                     \
        for (int r = 0; r < RB; r++)                                                       \
            for (int j = 0; j < 4; j++) {                                                  \
                float v = 0.0f;                                                            \
                for (int64_t g = 0; g < groups; g++) {                                     \
                    const int8_t *rec = w + g * Q8_RECORD, *p = rec + 32 * j;              \
                    const int8_t *xv = xq + r * k + g * 32;                                \
                    int32_t acc = 0;                                                       \
                    for (int i = 0; i < 32; i++) acc += p[i] * xv[i];                      \
                    uint16_t sc;                                                           \
                    memcpy(&sc, rec + 128 + 2 * j, 2);                                     \
                    v += half_to_float(sc) * dx[r * groups + g] * (float)acc;              \
                }                                                                          \
                out[r * 4 + j] = v;                                                        \
            }                                                                              \
    }
#endif

Q8_TILE(1)
Q8_TILE(2)

/* On AVX-512 VNNI + BW: two rows' 64 weights per 512-bit register, flipped to unsigned
 * (q + 128, one xor) for vpdpbusd against the group's activations in both halves; the
 * 128 * sum(x) the flip adds is taken off through xsum, as int4's minimum term. */
#if TI_I4_ZMM
#define Q8Z_TILE(RB)                                                                       \
    static void q8z_tile_##RB(const int8_t *w, const int8_t *xq, const float *dx,          \
                              const float *xsum, int64_t k, float *out) {                  \
        const int64_t groups = k / 32, pf = prefetch_bytes[TI_PREFETCH_Q8];                \
        const __m512i flip = _mm512_set1_epi8((char)0x80);                                 \
        const __m512i spread01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0,                 \
                                                   1, 1, 1, 1, 1, 1, 1, 1);                \
        const __m512i spread23 = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2,                 \
                                                   3, 3, 3, 3, 3, 3, 3, 3);                \
        __m512 a01[RB], a23[RB];                                                           \
        __m128 am[RB];                                                                     \
        for (int r = 0; r < RB; r++) {                                                     \
            a01[r] = a23[r] = _mm512_setzero_ps();                                         \
            am[r] = _mm_setzero_ps();                                                      \
        }                                                                                  \
        for (int64_t g = 0; g < groups; g++, w += Q8_RECORD) {                             \
            Q8_PREFETCH(w);                                                                \
            __m512i u01 = _mm512_xor_si512(_mm512_loadu_si512((const void *)w), flip);     \
            __m512i u23 = _mm512_xor_si512(_mm512_loadu_si512((const void *)(w + 64)), flip); \
            __m128 sc = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(w + 128)));         \
            __m512 s01 = _mm512_permutexvar_ps(spread01, _mm512_castps128_ps512(sc));      \
            __m512 s23 = _mm512_permutexvar_ps(spread23, _mm512_castps128_ps512(sc));      \
            __m128 mn = _mm_mul_ps(sc, _mm_set1_ps(-128.0f));                              \
            for (int r = 0; r < RB; r++) {                                                 \
                const int8_t *xg = xq + r * k + 32 * g;                                    \
                __m512i xb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)xg)); \
                __m512i p01 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u01, xb);        \
                __m512i p23 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u23, xb);        \
                __m512 d = _mm512_set1_ps(dx[r * groups + g]);                             \
                a01[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p01), _mm512_mul_ps(s01, d), a01[r]); \
                a23[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p23), _mm512_mul_ps(s23, d), a23[r]); \
                am[r] = _mm_fmadd_ps(mn, _mm_set1_ps(xsum[r * groups + g]), am[r]);        \
            }                                                                              \
        }                                                                                  \
        for (int r = 0; r < RB; r++) {                                                     \
            __m256 r0 = _mm512_castps512_ps256(a01[r]);                                    \
            __m256 r1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a01[r]), 1)); \
            __m256 r2 = _mm512_castps512_ps256(a23[r]);                                    \
            __m256 r3 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a23[r]), 1)); \
            _mm_storeu_ps(out + 4 * r, _mm_add_ps(hsum4_f32(r0, r1, r2, r3), am[r]));      \
        }                                                                                  \
    }

Q8Z_TILE(1)
Q8Z_TILE(2)
Q8Z_TILE(4)
#endif

GROUPED_LINEAR(ti_q8_linear, int8_t, Q8_RECORD, q8)

/* ---- fp32 ------------------------------------------------------------------------ */

/* Tiles of 4 output rows as for int8, interleaved per 16 columns (kp = k rounded up to
 * 16, zero padded): one sequential stream per tile. out[r * 4 + j] as for int8. */
#if TI_AVX2
#if TI_F32Z
/* One activation row: two accumulators per output row, so eight independent FMA chains
 * cover FMA's latency; the 512-bit passes of several rows add the same products in the
 * same order (lanes 0-7 the a chain, 8-15 the b chain). */
static void f32_tile_1(const float *w, const float *x, int64_t kp, float *out,
                       int64_t ldo) {
    __m256 a[4], b[4];
    for (int j = 0; j < 4; j++) a[j] = b[j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kp; k += 16, w += 64) {
        __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
        for (int j = 0; j < 4; j++) {
            a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(w + 16 * j), x0, a[j]);
            b[j] = _mm256_fmadd_ps(_mm256_loadu_ps(w + 16 * j + 8), x1, b[j]);
        }
    }
    for (int j = 0; j < 4; j++) a[j] = _mm256_add_ps(a[j], b[j]);
    _mm_storeu_ps(out, hsum4_f32(a[0], a[1], a[2], a[3]));
}
#else
/* One activation row, without the 512-bit passes: one accumulator per output row, each
 * block's two halves added into it in turn, as the 256-bit tiles of 2 and 3 rows below
 * add them (their registers hold no second chain), so every row of a verification gets
 * what a plain decode step gets, to the bit. Four FMA chains: the weights stream from
 * memory slower than they would feed eight. */
static void f32_tile_1(const float *w, const float *x, int64_t kp, float *out,
                       int64_t ldo) {
    (void)ldo;
    __m256 a[4];
    for (int j = 0; j < 4; j++) a[j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kp; k += 16, w += 64) {
        __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
        for (int j = 0; j < 4; j++) {
            a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(w + 16 * j), x0, a[j]);
            a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(w + 16 * j + 8), x1, a[j]);
        }
    }
    _mm_storeu_ps(out, hsum4_f32(a[0], a[1], a[2], a[3]));
}
#endif

/* Keeps v in a register: without it gcc folds the activation loads into the FMAs as
 * memory operands, reloading each once per output row (12 loads for 8 FMAs at two rows,
 * 32 for 24 at three), and Zen 3 takes two 256-bit loads a cycle: the loads, not the
 * FMAs, set the pace. */
#define F32_KEEP(v) __asm__("" : "+x"(v))

/* Two activation rows: 8 accumulators, the half-block's 4 weight vectors and 2
 * activation vectors in registers (14 of 16): 6 loads for 8 FMAs. */
static void f32_tile_2(const float *w, const float *x, int64_t kp, float *out,
                       int64_t ldo) {
    __m256 a[2][4];
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 4; j++) a[r][j] = _mm256_setzero_ps();
    const float *x1p = x + kp;
    for (int64_t k = 0; k < kp; k += 16, w += 64) {
        for (int h = 0; h < 2; h++) {
            __m256 x0 = _mm256_loadu_ps(x + k + 8 * h), x1 = _mm256_loadu_ps(x1p + k + 8 * h);
            F32_KEEP(x0);
            F32_KEEP(x1);
            for (int j = 0; j < 4; j++) {
                __m256 wv = _mm256_loadu_ps(w + 16 * j + 8 * h);
                F32_KEEP(wv);
                a[0][j] = _mm256_fmadd_ps(wv, x0, a[0][j]);
                a[1][j] = _mm256_fmadd_ps(wv, x1, a[1][j]);
            }
        }
    }
    for (int r = 0; r < 2; r++)
        _mm_storeu_ps(out + r * ldo, hsum4_f32(a[r][0], a[r][1], a[r][2], a[r][3]));
}

/* Three activation rows: 12 accumulators, 3 activation vectors and one weight vector at
 * a time, all 16 registers: 7 loads for 12 FMAs. Written out in assembly because gcc,
 * one register short, spills accumulators or folds loads back into the FMAs. */
static void f32_tile_3(const float *w, const float *x, int64_t kp, float *out,
                       int64_t ldo) {
    __m256 a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, x0, x1, x2, wv;
    int64_t blocks = kp / 16, stride = kp * 4;
    if (blocks == 0) {
        for (int r = 0; r < 3; r++) memset(out + r * ldo, 0, 4 * sizeof(float));
        return;
    }
    __asm__ volatile(
                     "vxorps %[a00], %[a00], %[a00]\n\t"
                     "vxorps %[a01], %[a01], %[a01]\n\t"
                     "vxorps %[a02], %[a02], %[a02]\n\t"
                     "vxorps %[a03], %[a03], %[a03]\n\t"
                     "vxorps %[a10], %[a10], %[a10]\n\t"
                     "vxorps %[a11], %[a11], %[a11]\n\t"
                     "vxorps %[a12], %[a12], %[a12]\n\t"
                     "vxorps %[a13], %[a13], %[a13]\n\t"
                     "vxorps %[a20], %[a20], %[a20]\n\t"
                     "vxorps %[a21], %[a21], %[a21]\n\t"
                     "vxorps %[a22], %[a22], %[a22]\n\t"
                     "vxorps %[a23], %[a23], %[a23]\n\t"
                     "1:\n\t"
                     "vmovups 0(%[x]), %[x0]\n\t"
                     "vmovups 0(%[x],%[s],1), %[x1]\n\t"
                     "vmovups 0(%[x],%[s],2), %[x2]\n\t"
                     "vmovups 0(%[w]), %[wv]\n\t"
                     "vfmadd231ps %[wv], %[x0], %[a00]\n\t"
                     "vfmadd231ps %[wv], %[x1], %[a10]\n\t"
                     "vfmadd231ps %[wv], %[x2], %[a20]\n\t"
                     "vmovups 64(%[w]), %[wv]\n\t"
                     "vfmadd231ps %[wv], %[x0], %[a01]\n\t"
                     "vfmadd231ps %[wv], %[x1], %[a11]\n\t"
                     "vfmadd231ps %[wv], %[x2], %[a21]\n\t"
                     "vmovups 128(%[w]), %[wv]\n\t"
                     "vfmadd231ps %[wv], %[x0], %[a02]\n\t"
                     "vfmadd231ps %[wv], %[x1], %[a12]\n\t"
                     "vfmadd231ps %[wv], %[x2], %[a22]\n\t"
                     "vmovups 192(%[w]), %[wv]\n\t"
                     "vfmadd231ps %[wv], %[x0], %[a03]\n\t"
                     "vfmadd231ps %[wv], %[x1], %[a13]\n\t"
                     "vfmadd231ps %[wv], %[x2], %[a23]\n\t"
                     "vmovups 32(%[x]), %[x0]\n\t"
                     "vmovups 32(%[x],%[s],1), %[x1]\n\t"
                     "vmovups 32(%[x],%[s],2), %[x2]\n\t"
                     "vmovups 32(%[w]), %[wv]\n\t"
                     "vfmadd231ps %[wv], %[x0], %[a00]\n\t"
                     "vfmadd231ps %[wv], %[x1], %[a10]\n\t"
                     "vfmadd231ps %[wv], %[x2], %[a20]\n\t"
                     "vmovups 96(%[w]), %[wv]\n\t"
                     "vfmadd231ps %[wv], %[x0], %[a01]\n\t"
                     "vfmadd231ps %[wv], %[x1], %[a11]\n\t"
                     "vfmadd231ps %[wv], %[x2], %[a21]\n\t"
                     "vmovups 160(%[w]), %[wv]\n\t"
                     "vfmadd231ps %[wv], %[x0], %[a02]\n\t"
                     "vfmadd231ps %[wv], %[x1], %[a12]\n\t"
                     "vfmadd231ps %[wv], %[x2], %[a22]\n\t"
                     "vmovups 224(%[w]), %[wv]\n\t"
                     "vfmadd231ps %[wv], %[x0], %[a03]\n\t"
                     "vfmadd231ps %[wv], %[x1], %[a13]\n\t"
                     "vfmadd231ps %[wv], %[x2], %[a23]\n\t"
                     "add $256, %[w]\n\t"
                     "add $64, %[x]\n\t"
                     "dec %[n]\n\t"
                     "jnz 1b\n\t"
                     : [a00] "=&x"(a00), [a01] "=&x"(a01), [a02] "=&x"(a02), [a03] "=&x"(a03),
                       [a10] "=&x"(a10), [a11] "=&x"(a11), [a12] "=&x"(a12), [a13] "=&x"(a13),
                       [a20] "=&x"(a20), [a21] "=&x"(a21), [a22] "=&x"(a22), [a23] "=&x"(a23),
                       [x0] "=&x"(x0), [x1] "=&x"(x1), [x2] "=&x"(x2), [wv] "=&x"(wv),
                       [w] "+r"(w), [x] "+r"(x), [n] "+r"(blocks)
                     : [s] "r"(stride)
                     : "cc", "memory");
    _mm_storeu_ps(out, hsum4_f32(a00, a01, a02, a03));
    _mm_storeu_ps(out + ldo, hsum4_f32(a10, a11, a12, a13));
    _mm_storeu_ps(out + 2 * ldo, hsum4_f32(a20, a21, a22, a23));
}

#if TI_F32Z
/* Up to six activation rows in one pass over a tile, on 512-bit registers: one
 * accumulator per activation row and output row holds a whole block of 16 columns (24
 * accumulators, the block's 4 weight vectors and one activation vector: 29 of 32
 * registers), 4 + R loads for 4R FMAs. Lanes 0-7 of an accumulator are f32_tile_1's a
 * chain and lanes 8-15 its b chain, the same products added in the same order, and the
 * halves are added as a + b before the same horizontal sum: each row's outputs equal its
 * one-row call bit for bit, so a verification's rows give what plain decoding gives.
 *
 * The first pass over a tile streams it from memory; with ``ahead`` > 0 it asks for the
 * lines that many bytes further down the weights (tiles are consecutive: one stream)
 * while it works (the f32 setting: ti_f32_linear). On a Zen 4 (two 256-bit FMA pipes)
 * the 256-bit tiles' 3 + 2 + 2 passes of 7 rows ran the stream's arrival and the
 * arithmetic one after the other (the demo target's 7 rows 0.67 ms in cache, 0.85-0.90
 * streamed); a first pass of 4 rows fetching 4-8 KiB ahead hides the stream under its
 * FMAs: 4 rows cost what one row costs (benchmarks/llm/README.md, "fp32 rows on 512-bit
 * registers"). */
static inline __m256 f32z_fold(__m512 a) {
    return _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
}

/* Named accumulators, not an array: with an array gcc kept a copy of all of them on the
 * stack (24 512-bit stores before the loop and 24 after it, a fifth of the time at K 256). */
#define F32Z_ROW(r)                                                                        \
    if (R > r) {                                                                           \
        __m512 xv = _mm512_loadu_ps(x + r * kp + k);                                       \
        __asm__("" : "+v"(xv));     /* one load, not one per FMA (F32_KEEP) */             \
        a##r##0 = _mm512_fmadd_ps(w0, xv, a##r##0);                                        \
        a##r##1 = _mm512_fmadd_ps(w1, xv, a##r##1);                                        \
        a##r##2 = _mm512_fmadd_ps(w2, xv, a##r##2);                                        \
        a##r##3 = _mm512_fmadd_ps(w3, xv, a##r##3);                                        \
    }
#define F32Z_OUT(r)                                                                        \
    if (R > r)                                                                             \
        _mm_storeu_ps(out + r * ldo, hsum4_f32(f32z_fold(a##r##0), f32z_fold(a##r##1),     \
                                               f32z_fold(a##r##2), f32z_fold(a##r##3)));

static inline __attribute__((always_inline)) void f32z_rows(const float *w, const float *x,
                                                            int64_t kp, float *out,
                                                            int64_t ldo, int64_t ahead,
                                                            const int R) {
    const __m512 z = _mm512_setzero_ps();
    __m512 a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z;
    __m512 a20 = z, a21 = z, a22 = z, a23 = z, a30 = z, a31 = z, a32 = z, a33 = z;
    __m512 a40 = z, a41 = z, a42 = z, a43 = z, a50 = z, a51 = z, a52 = z, a53 = z;
    for (int64_t k = 0; k < kp; k += 16, w += 64) {
        __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16),
               w2 = _mm512_loadu_ps(w + 32), w3 = _mm512_loadu_ps(w + 48);
        /* Registers: folded into the FMAs as memory operands they load once per row. */
        __asm__("" : "+v"(w0), "+v"(w1), "+v"(w2), "+v"(w3));
        if (ahead) {    /* prefetches never fault: past the last tile is harmless */
            const char *p = (const char *)w + ahead;
            _mm_prefetch(p, _MM_HINT_T0);
            _mm_prefetch(p + 64, _MM_HINT_T0);
            _mm_prefetch(p + 128, _MM_HINT_T0);
            _mm_prefetch(p + 192, _MM_HINT_T0);
        }
        F32Z_ROW(0) F32Z_ROW(1) F32Z_ROW(2) F32Z_ROW(3) F32Z_ROW(4) F32Z_ROW(5)
    }
    F32Z_OUT(0) F32Z_OUT(1) F32Z_OUT(2) F32Z_OUT(3) F32Z_OUT(4) F32Z_OUT(5)
}

#define F32Z_TILE(R)                                                                       \
    static void f32z_tile_##R(const float *w, const float *x, int64_t kp, float *out,     \
                              int64_t ldo, int64_t ahead) {                                \
        f32z_rows(w, x, kp, out, ldo, ahead, R);                                           \
    }
F32Z_TILE(2)
F32Z_TILE(3)
F32Z_TILE(4)
F32Z_TILE(5)
F32Z_TILE(6)
#endif
#else
#define F32_TILE(RB)                                                                       \
    static void f32_tile_##RB(const float *w, const float *x, int64_t kp, float *out,    \
                              int64_t ldo) {                                               \
        for (int r = 0; r < RB; r++)                                                       \
            for (int j = 0; j < 4; j++) {                                                  \
                float v = 0.0f;                                                            \
                for (int64_t k = 0; k < kp; k++)                                           \
                    v += w[(k / 16) * 64 + j * 16 + k % 16] * x[r * kp + k];               \
                out[r * ldo + j] = v;                                                      \
            }                                                                              \
    }
F32_TILE(1)
F32_TILE(2)
F32_TILE(3)
#endif

#if TI_F32Z
/* How many of the ``left`` activation rows the next pass over a tile takes: all of them up
 * to 6, else as evenly as passes of at most 6 allow (7 = 4 + 3: no lone row, whose pass
 * runs at half the FMA rate). */
static inline int f32z_take(int64_t left) {
    if (left <= 6) return (int)left;
    int64_t passes = (left + 5) / 6;
    return (int)((left + passes - 1) / passes);
}

/* ti_f32_linear on 512-bit passes, the first over each tile (4 rows or more) fetching
 * ``ahead`` bytes down the weight stream. */
static void f32z_linear(const float *x, int64_t rows, const float *w, int64_t n, int64_t kp,
                        float *y, int64_t ahead) {
    float acc[24];      /* a partial last tile's outputs, up to 6 rows of 4 */
    for (int64_t t = 0; t < n; t += 4) {
        const float *wt = w + t * kp;
        int nb = n - t < 4 ? (int)(n - t) : 4;
        /* Whole tiles store straight into y; the last, partial one goes through acc. */
        int64_t ldo = nb == 4 ? n : 4;
        for (int64_t r = 0; r < rows;) {
            int take = f32z_take(rows - r);
            float *o = nb == 4 ? y + r * n + t : acc;
            const float *xr = x + r * kp;
            int64_t fetch = r == 0 && take >= 4 ? ahead : 0;
            switch (take) {
            case 6: f32z_tile_6(wt, xr, kp, o, ldo, fetch); break;
            case 5: f32z_tile_5(wt, xr, kp, o, ldo, fetch); break;
            case 4: f32z_tile_4(wt, xr, kp, o, ldo, fetch); break;
            case 3: f32z_tile_3(wt, xr, kp, o, ldo, 0); break;
            case 2: f32z_tile_2(wt, xr, kp, o, ldo, 0); break;
            default: f32_tile_1(wt, xr, kp, o, ldo);
            }
            if (nb < 4)
                for (int a = 0; a < take; a++)
                    for (int j = 0; j < nb; j++) y[(r + a) * n + t + j] = acc[4 * a + j];
            r += take;
        }
    }
}
#endif

/* The f32 setting from which the 512-bit passes run; 0 where this build has none. */
int64_t ti_f32_wide_from(void) {
#if TI_F32Z
    return TI_F32Z_AHEAD_MIN;
#else
    return 0;
#endif
}

/* Where kp > k, *x's rows copied to *padded (allocated here, the caller frees it) with the
 * weights' zero padding, and *x pointed at them: kp is a multiple of 16, so every row
 * starts on a cache line. -1 without memory. */
static int pad_rows(const float **x, int64_t rows, int64_t k, int64_t kp, float **padded) {
    *padded = NULL;
    if (kp == k) return 0;
    size_t bytes = (size_t)(rows * kp) * sizeof(float);
    *padded = (float *)aligned_alloc(64, bytes);
    if (!*padded) return -1;
    memset(*padded, 0, bytes);
    for (int64_t r = 0; r < rows; r++)
        memcpy(*padded + r * kp, *x + r * k, (size_t)k * sizeof(float));
    *x = *padded;
    return 0;
}

int ti_f32_linear(const float *x, int64_t rows, int64_t k, const float *w,
                  const float *bias, int64_t n, int64_t kp, float *y) {
    float *padded;
    if (pad_rows(&x, rows, k, kp, &padded)) return -1;
#if TI_F32Z
    /* The f32 setting, measured at load, picks the passes of several rows: from
     * TI_F32Z_AHEAD_MIN up the 512-bit ones, fetching that many bytes ahead; below it
     * the 256-bit tiles, as on an AVX2 CPU. On a Zen 4 the 512-bit passes ran 4-8 rows
     * 1.1-1.25x faster than the 256-bit tiles on a quiet machine, and 9 rows 5-15%
     * slower with busy neighbours; the load measures only the 512-bit ones, whose rows
     * equal one-row calls bit for bit (llm/backends/cpu/prefetch.py, f32_settings). */
    if (rows > 1 && prefetch_bytes[TI_PREFETCH_F32] >= TI_F32Z_AHEAD_MIN) {
        f32z_linear(x, rows, w, n, kp, y, prefetch_bytes[TI_PREFETCH_F32]);
        goto done;
    }
#endif
    float acc[12];
#if TI_AVX2
    const int fetch_next = rows > 1 && kp <= 512 && prefetch_bytes[TI_PREFETCH_F32] > 0;
#endif
    for (int64_t t = 0; t < n; t += 4) {
        const float *wt = w + t * kp;
        int nb = n - t < 4 ? (int)(n - t) : 4;
#if TI_AVX2
        /* Several rows, where the f32 setting asks for it: the next tile is fetched
         * while this one is worked on, a share of it before each row group (on a Zen 3
         * the hardware prefetcher alone left the arithmetic and the tile's arrival one
         * after the other: on the demo model 3 rows cost 1.30x one row, 1.13x with the
         * next tile fetched; with all of it fetched before the first group, the memory
         * sat idle through the later ones: 4 rows cost 1.30x one row, about 1.15x with
         * the fetch spread over the groups). On a Zen 4 the same fetch made the demo
         * model's 2-9-row steps 10-25% slower than the hardware prefetcher alone (a burst
         * of 64 lines fills the core's miss buffers ahead of its own loads), hence a
         * setting measured at load. Small tiles only: a 12-32 KB tile (K 768-2048)
         * fetched beside the current one crowds the 32 KB L1 (up to 35% slower with the
         * weights in cache). */
        int prefetch = fetch_next && t + 4 < n;
        int64_t share = (4 * kp / ((rows + 2) / 3) + 15) / 16 * 16, fetched = 0;
#endif
        /* Whole tiles store straight into y; the last, partial one goes through acc. */
        int64_t ldo = nb == 4 ? n : 4;
        /* Rows in threes, the rest in twos (4 = 2 + 2): a lone leftover row on the
         * one-row tile measured as slow as three rows on the three-row one. That makes
         * ceil(rows / 3) groups. */
        for (int64_t r = 0; r < rows;) {
            int64_t left = rows - r;
            int take = left == 1 ? 1 : (left == 2 || left == 4) ? 2 : 3;
#if TI_AVX2
            for (int64_t end = fetched + share; prefetch && fetched < end && fetched < 4 * kp;
                 fetched += 16)
                _mm_prefetch((const char *)(wt + 4 * kp + fetched), _MM_HINT_T0);
#endif
            float *o = nb == 4 ? y + r * n + t : acc;
            if (take == 3) f32_tile_3(wt, x + r * kp, kp, o, ldo);
            else if (take == 2) f32_tile_2(wt, x + r * kp, kp, o, ldo);
            else f32_tile_1(wt, x + r * kp, kp, o, ldo);
            if (nb < 4)
                for (int a = 0; a < take; a++)
                    for (int j = 0; j < nb; j++) y[(r + a) * n + t + j] = acc[4 * a + j];
            r += take;
        }
    }
#if TI_F32Z
done:
#endif
    if (bias)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < n; j++) y[r * n + j] += bias[j];
    free(padded);
    return 0;
}

/* ---- fp32 arithmetic on 16-bit weights --------------------------------------------- */

/* Weights that are exactly fp16 or bf16 numbers (a checkpoint stored in half precision
 * and widened at load) kept in 16 bits, in the fp32 kernel's tile layout (``w`` holds
 * fp16 or bf16 bit patterns where that kernel holds floats). Each weight is widened to
 * the float it is as it is loaded, and the products and sums are the fp32 kernel's, in
 * its order: the 512-bit passes where the build has them (a lone row too, as the fp32
 * one-row tile sums in their order), else the 256-bit tiles of the AVX2 build, else the
 * plain C loop. Each result then equals the fp32 kernel's on the same weights bit for
 * bit (the fp32 kernel's 512-bit setting on an AVX-512 build), each row of a several-row
 * call equals its one-row call, and the weight stream from memory is half as long. */
#if TI_F32Z
static inline __m512 h16z_widen(const uint16_t *w, const int bf) {
    __m256i h = _mm256_loadu_si256((const __m256i *)w);
    return bf ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
              : _mm512_cvtph_ps(h);
}

/* f32z_rows on 16-bit weights (a block of 16 columns of 4 output rows: 128 bytes),
 * without its fetch ahead: with the stream halved the passes wait on their FMAs, and
 * fetching 2-16 KiB ahead changed no row count's time (demo model, Zen 4, 1-7 rows). */
static inline __attribute__((always_inline)) void h16z_rows(const uint16_t *w, const float *x,
                                                            int64_t kp, float *out,
                                                            int64_t ldo, const int R,
                                                            const int bf) {
    const __m512 z = _mm512_setzero_ps();
    __m512 a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z;
    __m512 a20 = z, a21 = z, a22 = z, a23 = z, a30 = z, a31 = z, a32 = z, a33 = z;
    __m512 a40 = z, a41 = z, a42 = z, a43 = z, a50 = z, a51 = z, a52 = z, a53 = z;
    for (int64_t k = 0; k < kp; k += 16, w += 64) {
        __m512 w0 = h16z_widen(w, bf), w1 = h16z_widen(w + 16, bf),
               w2 = h16z_widen(w + 32, bf), w3 = h16z_widen(w + 48, bf);
        __asm__("" : "+v"(w0), "+v"(w1), "+v"(w2), "+v"(w3));
        F32Z_ROW(0) F32Z_ROW(1) F32Z_ROW(2) F32Z_ROW(3) F32Z_ROW(4) F32Z_ROW(5)
    }
    F32Z_OUT(0) F32Z_OUT(1) F32Z_OUT(2) F32Z_OUT(3) F32Z_OUT(4) F32Z_OUT(5)
}

typedef void (*h16_pass)(const uint16_t *, const float *, int64_t, float *, int64_t);
#define H16Z_PASS(R, BF, NAME)                                                             \
    static void NAME##_##R(const uint16_t *w, const float *x, int64_t kp, float *out,     \
                           int64_t ldo) {                                                  \
        h16z_rows(w, x, kp, out, ldo, R, BF);                                              \
    }
#define H16Z_PASSES(BF, NAME)                                                              \
    H16Z_PASS(1, BF, NAME) H16Z_PASS(2, BF, NAME) H16Z_PASS(3, BF, NAME)                   \
    H16Z_PASS(4, BF, NAME) H16Z_PASS(5, BF, NAME) H16Z_PASS(6, BF, NAME)                   \
    static const h16_pass NAME[7] = {NULL, NAME##_1, NAME##_2, NAME##_3, NAME##_4,        \
                                      NAME##_5, NAME##_6};
H16Z_PASSES(0, f16z_passes)
H16Z_PASSES(1, bf16z_passes)
#elif TI_AVX2
static inline __m256 h16_widen(const uint16_t *w, const int bf) {
    __m128i h = _mm_loadu_si128((const __m128i *)w);
    return bf ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
              : _mm256_cvtph_ps(h);
}

/* R (1-2) rows over one tile in the AVX2 build's fp32 order (f32_tile_1/2/3: one
 * accumulator per row and output row, each block's two halves added into it in turn). */
static inline __attribute__((always_inline)) void h16_rows(const uint16_t *w, const float *x,
                                                           int64_t kp, float *out,
                                                           int64_t ldo, const int R,
                                                           const int bf) {
    __m256 a[2][4];
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 4; j++) a[r][j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kp; k += 16, w += 64) {
        for (int h = 0; h < 2; h++) {
            __m256 xv[2];
            for (int r = 0; r < R; r++) {
                xv[r] = _mm256_loadu_ps(x + r * kp + k + 8 * h);
                F32_KEEP(xv[r]);
            }
            for (int j = 0; j < 4; j++) {
                __m256 wv = h16_widen(w + 16 * j + 8 * h, bf);
                for (int r = 0; r < R; r++) a[r][j] = _mm256_fmadd_ps(wv, xv[r], a[r][j]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        _mm_storeu_ps(out + r * ldo, hsum4_f32(a[r][0], a[r][1], a[r][2], a[r][3]));
}

/* Three rows as f32_tile_3 runs them, in assembly for the same reason (all 16 registers:
 * the intrinsics above kept 3 of the 12 accumulators on the stack, stored and reloaded in
 * every block); each weight vector widened into its register as it is loaded. */
#define H16_WIDEN_F16(off) "vcvtph2ps " off "(%[w]), %[wv]\n\t"
#define H16_WIDEN_BF16(off) "vpmovzxwd " off "(%[w]), %[wv]\n\t" "vpslld $16, %[wv], %[wv]\n\t"
#define H16_FMA3(a0, a1, a2)                                                               \
    "vfmadd231ps %[wv], %[x0], %[" a0 "]\n\t"                                              \
    "vfmadd231ps %[wv], %[x1], %[" a1 "]\n\t"                                              \
    "vfmadd231ps %[wv], %[x2], %[" a2 "]\n\t"
#define H16_HALF(W, xoff, o0, o1, o2, o3)                                                  \
    "vmovups " xoff "(%[x]), %[x0]\n\t"                                                    \
    "vmovups " xoff "(%[x],%[s],1), %[x1]\n\t"                                             \
    "vmovups " xoff "(%[x],%[s],2), %[x2]\n\t"                                             \
    W(o0) H16_FMA3("a00", "a10", "a20") W(o1) H16_FMA3("a01", "a11", "a21")                \
    W(o2) H16_FMA3("a02", "a12", "a22") W(o3) H16_FMA3("a03", "a13", "a23")
#define H16_TILE_3(NAME, W)                                                                \
    static void NAME(const uint16_t *w, const float *x, int64_t kp, float *out,           \
                     int64_t ldo) {                                                        \
        __m256 a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, x0, x1, x2, wv; \
        int64_t blocks = kp / 16, stride = kp * 4;                                         \
        if (blocks == 0) {                                                                 \
            for (int r = 0; r < 3; r++) memset(out + r * ldo, 0, 4 * sizeof(float));       \
            return;                                                                        \
        }                                                                                  \
        __asm__ volatile("vxorps %[a00], %[a00], %[a00]\n\t"                               \
                         "vxorps %[a01], %[a01], %[a01]\n\t"                               \
                         "vxorps %[a02], %[a02], %[a02]\n\t"                               \
                         "vxorps %[a03], %[a03], %[a03]\n\t"                               \
                         "vxorps %[a10], %[a10], %[a10]\n\t"                               \
                         "vxorps %[a11], %[a11], %[a11]\n\t"                               \
                         "vxorps %[a12], %[a12], %[a12]\n\t"                               \
                         "vxorps %[a13], %[a13], %[a13]\n\t"                               \
                         "vxorps %[a20], %[a20], %[a20]\n\t"                               \
                         "vxorps %[a21], %[a21], %[a21]\n\t"                               \
                         "vxorps %[a22], %[a22], %[a22]\n\t"                               \
                         "vxorps %[a23], %[a23], %[a23]\n\t"                               \
                         "1:\n\t"                                                          \
                         H16_HALF(W, "0", "0", "32", "64", "96")                           \
                         H16_HALF(W, "32", "16", "48", "80", "112")                        \
                         "add $128, %[w]\n\t"                                              \
                         "add $64, %[x]\n\t"                                               \
                         "dec %[n]\n\t"                                                    \
                         "jnz 1b\n\t"                                                      \
                         : [a00] "=&x"(a00), [a01] "=&x"(a01), [a02] "=&x"(a02),           \
                           [a03] "=&x"(a03), [a10] "=&x"(a10), [a11] "=&x"(a11),           \
                           [a12] "=&x"(a12), [a13] "=&x"(a13), [a20] "=&x"(a20),           \
                           [a21] "=&x"(a21), [a22] "=&x"(a22), [a23] "=&x"(a23),           \
                           [x0] "=&x"(x0), [x1] "=&x"(x1), [x2] "=&x"(x2), [wv] "=&x"(wv), \
                           [w] "+r"(w), [x] "+r"(x), [n] "+r"(blocks)                      \
                         : [s] "r"(stride)                                                 \
                         : "cc", "memory");                                                \
        _mm_storeu_ps(out, hsum4_f32(a00, a01, a02, a03));                                 \
        _mm_storeu_ps(out + ldo, hsum4_f32(a10, a11, a12, a13));                           \
        _mm_storeu_ps(out + 2 * ldo, hsum4_f32(a20, a21, a22, a23));                       \
    }
H16_TILE_3(f16_passes_3, H16_WIDEN_F16)
H16_TILE_3(bf16_passes_3, H16_WIDEN_BF16)

typedef void (*h16_pass)(const uint16_t *, const float *, int64_t, float *, int64_t);
#define H16_PASS(R, BF, NAME)                                                              \
    static void NAME##_##R(const uint16_t *w, const float *x, int64_t kp, float *out,     \
                           int64_t ldo) {                                                  \
        h16_rows(w, x, kp, out, ldo, R, BF);                                               \
    }
#define H16_PASSES(BF, NAME)                                                               \
    H16_PASS(1, BF, NAME) H16_PASS(2, BF, NAME)                                            \
    static const h16_pass NAME[4] = {NULL, NAME##_1, NAME##_2, NAME##_3};
H16_PASSES(0, f16_passes)
H16_PASSES(1, bf16_passes)
#else
static inline float h16_value(uint16_t h, int bf) {
    if (!bf) return half_to_float(h);
    uint32_t bits = (uint32_t)h << 16;
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}
#endif

static int h16_linear(const float *x, int64_t rows, int64_t k, const uint16_t *w,
                      const float *bias, int64_t n, int64_t kp, float *y, int bf) {
    float *padded;
    if (pad_rows(&x, rows, k, kp, &padded)) return -1;
    float acc[24];      /* a partial last tile's outputs */
#if TI_F32Z
    const h16_pass *passes = bf ? bf16z_passes : f16z_passes;
#elif TI_AVX2
    const h16_pass *passes = bf ? bf16_passes : f16_passes;
#endif
    for (int64_t t = 0; t < n; t += 4) {
        const uint16_t *wt = w + t * kp;
        int nb = n - t < 4 ? (int)(n - t) : 4;
        int64_t ldo = nb == 4 ? n : 4;
        for (int64_t r = 0; r < rows;) {
            float *o = nb == 4 ? y + r * n + t : acc;
#if TI_F32Z
            int take = f32z_take(rows - r);
            passes[take](wt, x + r * kp, kp, o, ldo);
#elif TI_AVX2
            int64_t left = rows - r;    /* as the fp32 tiles split them */
            int take = left == 1 ? 1 : (left == 2 || left == 4) ? 2 : 3;
            passes[take](wt, x + r * kp, kp, o, ldo);
#else
            int take = 1;
            (void)ldo;      /* one row at a time: o[j] */
            for (int j = 0; j < 4; j++) {
                float v = 0.0f;
                for (int64_t c = 0; c < kp; c++)
                    v += h16_value(wt[(c / 16) * 64 + j * 16 + c % 16], bf) * x[r * kp + c];
                o[j] = v;
            }
#endif
            if (nb < 4)
                for (int a = 0; a < take; a++)
                    for (int j = 0; j < nb; j++) y[(r + a) * n + t + j] = acc[4 * a + j];
            r += take;
        }
    }
    if (bias)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < n; j++) y[r * n + j] += bias[j];
    free(padded);
    return 0;
}

int ti_f16_linear(const float *x, int64_t rows, int64_t k, const uint16_t *w,
                  const float *bias, int64_t n, int64_t kp, float *y) {
    return h16_linear(x, rows, k, w, bias, n, kp, y, 0);
}

int ti_bf16_linear(const float *x, int64_t rows, int64_t k, const uint16_t *w,
                   const float *bias, int64_t n, int64_t kp, float *y) {
    return h16_linear(x, rows, k, w, bias, n, kp, y, 1);
}
