/* A decode step's work besides the linear layers, and a whole batch-1 decode step.
 *
 * At one row a small model's linear layers take a few milliseconds per token; the rest
 * of a step (norms, rotary embedding, the cache write, single-query attention, the
 * activation, residual adds) is a few dozen small tensor operations per layer, each of
 * which costs more in dispatch than in arithmetic. Here they are plain loops over float32:
 *   - ti_rms_norm: y = x / sqrt(mean(x^2) + eps) * w, per row.
 *   - ti_rope_kv: rotates the queries and keys of fused q|k|v rows in place (the "rotate
 *     half" form, with the sign folded into the sin table) and writes each row's keys and
 *     values to its slot of the paged cache.
 *   - ti_paged_decode_attention: one query per sequence over its cached keys and values,
 *     found through its block table; grouped heads share each key and value load.
 *   - ti_silu_mul: silu(gate) * up over fused gate|up rows.
 *   - ti_decode_step: a few new tokens of one sequence through every layer, the linear
 *     layers on kernels.c's native kernels; the caller applies the LM head to the normed
 *     output.
 *   - ti_greedy_steps: greedy steps of one sequence, LM head and argmax included (a
 *     speculative draft's proposal).
 *   - ti_greedy_rows: one step over a few rows of one sequence and every row's greedy
 *     choice (a plain greedy decode step, a speculative verification).
 * Compiled into one library with kernels.c and threads.c (loader.py); the linear layers
 * of a step run on threads.c's split of kernels.c's kernels.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#define TD_AVX2 1
#include <immintrin.h>
#else
#define TD_AVX2 0
#endif

#include "native.h"

#define MAX_HEAD_DIM 512

/* ---- vector helpers -------------------------------------------------------------- */

#if TD_AVX2
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp(x) for float lanes: Cephes' range reduction and degree-5 polynomial (about 1 ulp
 * in the range that matters), inputs clamped to where expf is finite and normal. */
static inline __m256 exp8(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3365478515625f);
    x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

static inline float dot(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    float s = 0.0f;
#if TD_AVX2
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s = hsum8(_mm256_add_ps(s0, s1));
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* y += a * x over n floats. */
static inline void axpy(float a, const float *x, float *y, int64_t n) {
    int64_t i = 0;
#if TD_AVX2
    const __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++) y[i] += a * x[i];
}

static inline void add_into(float *y, const float *x, int64_t n) {
    int64_t i = 0;
#if TD_AVX2
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) y[i] += x[i];
}

/* ---- norms, rotary, activation --------------------------------------------------- */

void ti_rms_norm(const float *x, int64_t rows, int64_t n, const float *w, float eps, float *y) {
    for (int64_t r = 0; r < rows; r++, x += n, y += n) {
        float inv = 1.0f / sqrtf(dot(x, x, n) / (float)n + eps);
        int64_t i = 0;
#if TD_AVX2
        const __m256 vi = _mm256_set1_ps(inv);
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vi),
                                                  _mm256_loadu_ps(w + i)));
#endif
        for (; i < n; i++) y[i] = x[i] * inv * w[i];
    }
}

/* Rows of [gate (inner) | up (inner)] -> rows of silu(gate) * up (inner). */
void ti_silu_mul(const float *gate_up, int64_t rows, int64_t inner, float *y) {
    for (int64_t r = 0; r < rows; r++, gate_up += 2 * inner, y += inner) {
        const float *g = gate_up, *u = gate_up + inner;
        int64_t i = 0;
#if TD_AVX2
        const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
        for (; i + 8 <= inner; i += 8) {
            __m256 gv = _mm256_loadu_ps(g + i);
            __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, gv))));
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u + i)));
        }
#endif
        for (; i < inner; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* qkv: rows of [heads + 2 * kv_heads, head_dim] (q, then k, then v). Rotates q and k in
 * place by each row's position (cos, sin_signed: [positions, head_dim] tables) and copies
 * k and v to the row's slot of k_cache / v_cache ([slots, kv_heads, head_dim]). */
int ti_rope_kv(float *qkv, int64_t rows, int64_t heads, int64_t kv_heads, int64_t head_dim,
               const float *cos, const float *sin_signed, const int64_t *positions,
               float *k_cache, float *v_cache, const int64_t *slots) {
    if (head_dim > MAX_HEAD_DIM || head_dim % 2) return -2;
    const int64_t half = head_dim / 2, width = (heads + 2 * kv_heads) * head_dim;
    const int64_t kv_width = kv_heads * head_dim;
    float tmp[MAX_HEAD_DIM];
    for (int64_t r = 0; r < rows; r++) {
        float *row = qkv + r * width;
        const float *c = cos + positions[r] * head_dim, *s = sin_signed + positions[r] * head_dim;
        for (int64_t h = 0; h < heads + kv_heads; h++) {
            float *v = row + h * head_dim;
            memcpy(tmp, v, (size_t)head_dim * sizeof(float));
            /* out[i] = v[i] * cos[i] + v[(i + half) % D] * sin_signed[i] (torch.roll) */
            for (int64_t i = 0; i < half; i++) v[i] = tmp[i] * c[i] + tmp[i + half] * s[i];
            for (int64_t i = half; i < head_dim; i++) v[i] = tmp[i] * c[i] + tmp[i - half] * s[i];
        }
        memcpy(k_cache + slots[r] * kv_width, row + heads * head_dim, (size_t)kv_width * sizeof(float));
        memcpy(v_cache + slots[r] * kv_width, row + (heads + kv_heads) * head_dim,
               (size_t)kv_width * sizeof(float));
    }
    return 0;
}

/* ---- attention ------------------------------------------------------------------- */

#if TD_AVX2
/* {sum of a's lanes, b's, c's, d's} */
static inline __m128 hsum4x8(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* scores[j * len] = scale * q_j . key for the group's heads j (q_j: q + j * head_dim). */
static void group_scores(const float *q, const float *key, int64_t group, int64_t head_dim,
                         float scale, float *scores, int64_t len) {
    for (int64_t j0 = 0; j0 < group; j0 += 4) {
        const int64_t nj = group - j0 < 4 ? group - j0 : 4;
        const float *qj = q + j0 * head_dim;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t c = 0; c < head_dim; c += 8) {
            const __m256 k = _mm256_loadu_ps(key + c);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qj + c), k, a0);
            if (nj > 1) a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qj + head_dim + c), k, a1);
            if (nj > 2) a2 = _mm256_fmadd_ps(_mm256_loadu_ps(qj + 2 * head_dim + c), k, a2);
            if (nj > 3) a3 = _mm256_fmadd_ps(_mm256_loadu_ps(qj + 3 * head_dim + c), k, a3);
        }
        float s[4];
        _mm_storeu_ps(s, _mm_mul_ps(hsum4x8(a0, a1, a2, a3), _mm_set1_ps(scale)));
        for (int64_t j = 0; j < nj; j++) scores[(j0 + j) * len] = s[j];
    }
}

/* scores[j * len + i] = scale * q_j . k_i for NJ heads j (q_j: q + j * head_dim) and
 * 4 positions i: each chunk of q_j and k_i loaded once for the NJ x 4 products. */
static inline void tile_scores(const float *q, const int NJ, const float *k0,
                               const float *k1, const float *k2, const float *k3,
                               int64_t head_dim, float scale, float *scores, int64_t len) {
    __m256 a[3][4];
    for (int j = 0; j < 3; j++)
        for (int i = 0; i < 4; i++) a[j][i] = _mm256_setzero_ps();
    for (int64_t c = 0; c < head_dim; c += 8) {
        __m256 qv[3];
        for (int j = 0; j < NJ; j++) qv[j] = _mm256_loadu_ps(q + j * head_dim + c);
        const __m256 kv[4] = {_mm256_loadu_ps(k0 + c), _mm256_loadu_ps(k1 + c),
                              _mm256_loadu_ps(k2 + c), _mm256_loadu_ps(k3 + c)};
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < NJ; j++) a[j][i] = _mm256_fmadd_ps(qv[j], kv[i], a[j][i]);
    }
    const __m128 vs = _mm_set1_ps(scale);
    for (int j = 0; j < NJ; j++)
        _mm_storeu_ps(scores + j * len,
                      _mm_mul_ps(hsum4x8(a[j][0], a[j][1], a[j][2], a[j][3]), vs));
}

/* out[c] += w0 * v0[c] + w1 * v1[c] + w2 * v2[c] + w3 * v3[c], in that order. */
static inline void axpy4(const float *w, const float *v0, const float *v1, const float *v2,
                         const float *v3, float *out, int64_t n) {
    const __m256 w0 = _mm256_set1_ps(w[0]), w1 = _mm256_set1_ps(w[1]);
    const __m256 w2 = _mm256_set1_ps(w[2]), w3 = _mm256_set1_ps(w[3]);
    for (int64_t c = 0; c < n; c += 8) {
        __m256 acc = _mm256_loadu_ps(out + c);
        acc = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0 + c), acc);
        acc = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v1 + c), acc);
        acc = _mm256_fmadd_ps(w2, _mm256_loadu_ps(v2 + c), acc);
        acc = _mm256_fmadd_ps(w3, _mm256_loadu_ps(v3 + c), acc);
        _mm256_storeu_ps(out + c, acc);
    }
}
#endif

/* exp(s[p] - m) in place over s[0..len), m the span's maximum (into *max); returns
 * their sum. */
static float exp_span(float *s, int64_t len, float *max) {
    float m = -INFINITY, sum = 0.0f;
    for (int64_t p = 0; p < len; p++) m = s[p] > m ? s[p] : m;
    int64_t p = 0;
#if TD_AVX2
    __m256 vs = _mm256_setzero_ps();
    const __m256 vm = _mm256_set1_ps(m);
    for (; p + 8 <= len; p += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + p), vm));
        _mm256_storeu_ps(s + p, e);
        vs = _mm256_add_ps(vs, e);
    }
    sum = hsum8(vs);
#endif
    for (; p < len; p++) {
        s[p] = expf(s[p] - m);
        sum += s[p];
    }
    *max = m;
    return sum;
}

/* softmax over s[0..len) in place, with the maximum subtracted, as SDPA does. */
static void softmax_span(float *s, int64_t len) {
    float m;
    const float inv = 1.0f / exp_span(s, len, &m);
    for (int64_t p = 0; p < len; p++) s[p] *= inv;
}

/* Rows this far ahead are requested before they are read: hardware prefetchers follow
 * a block's slots but not the jump to the sequence's next block. Into the L2, not the
 * L1: a long context's keys and values come from memory (SmolLM2-135M at 2,000 tokens
 * reads 92 MB of them a step), and fetches into the L1 hold its few miss buffers until
 * the data arrives, so the walk ran at 6.5 GB/s, a third of what streaming reaches; into
 * the L2, 16 rows ahead, the same decode step took 10 ms instead of 19-21 at 2,000
 * tokens, 6.7-6.9 instead of 11-13 at 1,000 and 4.8-5.1 instead of 6.3 at 256 (AMD Zen
 * 4, one thread; benchmarks/llm/README.md, "Long contexts"). */
#define PREFETCH_ROWS 16

static inline void prefetch_row(const float *row, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(row + i, 0, 2);
}

/* The first of a step's rows (row r at position start + r) that attends to position p. */
static inline int64_t first_row(int64_t p, int64_t start) { return p > start ? p - start : 0; }

/* Where a window's statistics go (attend_window): per row r and head h, the scores'
 * maximum at max[(r * heads + h) * stride] and the sum of their exponentials at sum[...];
 * a row that does not reach the window gets -inf and 0. */
typedef struct {
    float *max, *sum;
    int64_t stride;
} window_stats;

/* `rows` query rows of one sequence (new tokens at positions start.., row r attends to
 * positions 0..start + r; row r's query at q + r * q_stride) over the positions p0..p1 of
 * its keys and values in the paged cache; head h of row r out at out + r * out_row + h *
 * out_head. With stats NULL the window is every position (p0 0, p1 start + rows) and out
 * is the attention: the softmax's weights, with the maximum subtracted as SDPA does. With
 * stats, out is the values' sum weighted by exp(score - m), m the window's maximum for
 * that row and head, not normalized; m and the exponentials' sum go to stats (a chunk of
 * a long row, attend_chunked). offset ([p1 - p0]) and scores ([rows, heads, p1 - p0])
 * are the caller's scratch.
 *
 * The cache is walked in position order, each slot's whole row (every key-value head)
 * read once for every row's query heads: a walk per key-value head, reading a
 * kv_heads-th of each row, ran at a third of the speed once a 16-sequence batch's keys
 * no longer fit in the cache, and a walk per query row had re-read the cache row by row
 * (a 5-row verification of the demo model at position 150 spent a quarter of its time
 * so). A row's scores, softmax and weighted sum are the same operations in the same order
 * as for that row alone, so its result is the same to the bit; positions past a row's
 * own get weight zero. With AVX2 and head_dim a multiple of 8, the scores go in tiles of
 * 4 positions by up to 3 heads of a group (each chunk of a key or query loaded once per
 * tile, the tile's sums reduced together), and the values' weighted sum takes 4
 * positions per load and store of the output. Cache slots are kv_stride floats apart, so
 * a call can take some of the key-value heads (k_cache, v_cache, q and out advanced to
 * the first), as attend_split's parts do. Rows are fetched PREFETCH_ROWS ahead, past the
 * window's end too (the next chunk, which a thread taking chunks in turn reads next). */
static void attend_window(const float *q, int64_t rows, int64_t q_stride, int64_t heads,
                          int64_t kv_heads, int64_t head_dim, const float *k_cache,
                          const float *v_cache, int64_t kv_stride, const int64_t *table,
                          int64_t block_size, int64_t start, float scale, int64_t p0,
                          int64_t p1, float *out, int64_t out_row, int64_t out_head,
                          const window_stats *stats, int64_t *offset, float *scores) {
    const int64_t group = heads / kv_heads, kv_width = kv_heads * head_dim;
    const int64_t total = start + rows, span = p1 - p0;
    const int vec = TD_AVX2 && head_dim % 8 == 0;
    (void)vec;                  /* the AVX2 paths only */
#define SLOT(i) ((table[(i) / block_size] * block_size + (i) % block_size) * kv_stride)
#define AHEAD(i) ((i) < p1 ? offset[(i) - p0] : SLOT(i))
    for (int64_t p = p0; p < p1; p++) offset[p - p0] = SLOT(p);
    /* scores[r, h, p - p0] = scale * q_{r,h} . k_p (the key of h's group), every row
     * that reaches p */
    int64_t p4 = p0;
#if TD_AVX2
    for (; vec && p4 + 4 <= p1; p4 += 4) {
        const float *r0 = k_cache + offset[p4 - p0], *r1 = k_cache + offset[p4 - p0 + 1];
        const float *r2 = k_cache + offset[p4 - p0 + 2], *r3 = k_cache + offset[p4 - p0 + 3];
        for (int64_t i = p4 + PREFETCH_ROWS; i < p4 + PREFETCH_ROWS + 4 && i < total; i++)
            prefetch_row(k_cache + AHEAD(i), kv_width);
        for (int64_t r = first_row(p4, start); r < rows; r++) {
            const float *qr = q + r * q_stride;
            for (int64_t g = 0; g < kv_heads; g++) {
                const int64_t at = g * head_dim;
                for (int64_t j0 = 0; j0 < group; j0 += 3) {
                    const float *qj = qr + (g * group + j0) * head_dim;
                    float *sj = scores + (r * heads + g * group + j0) * span + (p4 - p0);
                    const float *k0 = r0 + at, *k1 = r1 + at, *k2 = r2 + at, *k3 = r3 + at;
                    /* constant head counts, so each call unrolls to its own FMAs */
                    switch (group - j0 < 3 ? group - j0 : 3) {
                    case 3: tile_scores(qj, 3, k0, k1, k2, k3, head_dim, scale, sj, span); break;
                    case 2: tile_scores(qj, 2, k0, k1, k2, k3, head_dim, scale, sj, span); break;
                    default: tile_scores(qj, 1, k0, k1, k2, k3, head_dim, scale, sj, span);
                    }
                }
            }
        }
    }
#endif
    for (int64_t p = p4; p < p1; p++) {
        const float *row = k_cache + offset[p - p0];
        if (p + PREFETCH_ROWS < total)
            prefetch_row(k_cache + AHEAD(p + PREFETCH_ROWS), kv_width);
        for (int64_t r = first_row(p, start); r < rows; r++)
            for (int64_t g = 0; g < kv_heads; g++) {
                const float *qg = q + r * q_stride + g * group * head_dim;
                const float *key = row + g * head_dim;
                float *sg = scores + (r * heads + g * group) * span + (p - p0);
#if TD_AVX2
                if (vec) {
                    group_scores(qg, key, group, head_dim, scale, sg, span);
                    continue;
                }
#endif
                for (int64_t j = 0; j < group; j++)
                    sg[j * span] = scale * dot(qg + j * head_dim, key, head_dim);
            }
    }
    /* the weights: zero past a row's end */
    for (int64_t r = 0; r < rows; r++) {
        const int64_t end = start + r + 1, len = (end < p1 ? end : p1) - p0;
        for (int64_t h = 0; h < heads; h++) {
            float *sh = scores + (r * heads + h) * span;
            memset(out + r * out_row + h * out_head, 0, (size_t)head_dim * sizeof(float));
            if (stats) {
                const int64_t at = (r * heads + h) * stats->stride;
                stats->max[at] = -INFINITY;
                stats->sum[at] = 0.0f;
                if (len <= 0) continue;
                stats->sum[at] = exp_span(sh, len, &stats->max[at]);
            } else {
                softmax_span(sh, len);
            }
            memset(sh + len, 0, (size_t)(span - len) * sizeof(float));
        }
    }
    int64_t p = p0;
#if TD_AVX2
    for (; vec && p + 4 <= p1; p += 4) {
        const float *v0 = v_cache + offset[p - p0], *v1 = v_cache + offset[p - p0 + 1];
        const float *v2 = v_cache + offset[p - p0 + 2], *v3 = v_cache + offset[p - p0 + 3];
        for (int64_t i = p + PREFETCH_ROWS; i < p + PREFETCH_ROWS + 4 && i < total; i++)
            prefetch_row(v_cache + AHEAD(i), kv_width);
        for (int64_t r = first_row(p, start); r < rows; r++)
            for (int64_t h = 0, g = 0; g < kv_heads; g++) {
                const int64_t at = g * head_dim;
                for (int64_t j = 0; j < group; j++, h++)
                    axpy4(scores + (r * heads + h) * span + (p - p0), v0 + at, v1 + at,
                          v2 + at, v3 + at, out + r * out_row + h * out_head, head_dim);
            }
    }
#endif
    for (; p < p1; p++) {
        const float *row = v_cache + offset[p - p0];
        for (int64_t r = first_row(p, start); r < rows; r++)
            for (int64_t h = 0, g = 0; g < kv_heads; g++)
                for (int64_t j = 0; j < group; j++, h++)
                    axpy(scores[(r * heads + h) * span + (p - p0)], row + g * head_dim,
                         out + r * out_row + h * out_head, head_dim);
    }
#undef AHEAD
#undef SLOT
}

/* attend_window over all of a row's positions: the attention, out: [rows, heads,
 * head_dim] with rows out_stride floats apart. */
static void attend_rows(const float *q, int64_t rows, int64_t q_stride, int64_t heads,
                        int64_t kv_heads, int64_t head_dim, const float *k_cache,
                        const float *v_cache, int64_t kv_stride, const int64_t *table,
                        int64_t block_size, int64_t start, float scale, float *out,
                        int64_t out_stride, int64_t *offset, float *scores) {
    attend_window(q, rows, q_stride, heads, kv_heads, head_dim, k_cache, v_cache, kv_stride,
                  table, block_size, start, scale, 0, start + rows, out, out_stride, head_dim,
                  NULL, offset, scores);
}

static int attend_chunked(const float *q, int64_t rows, int64_t q_stride, int64_t heads,
                          int64_t kv_heads, int64_t head_dim, const float *k_cache,
                          const float *v_cache, const int64_t *table, int64_t block_size,
                          int64_t start, float scale, float *out, int64_t out_stride);
#define ATTEND_CHUNK 128

/* attend_rows' scratch for rows query rows over up to `positions` positions, with
 * `walks` offset arrays (one per part that walks the cache at once); NULL: no memory.
 * One allocation, freed with free(*offset). */
static int64_t *attention_scratch(int64_t rows, int64_t heads, int64_t positions,
                                  int64_t walks, float **scores) {
    int64_t *offset = (int64_t *)malloc((size_t)(walks * positions) * sizeof(int64_t)
                                        + (size_t)(rows * heads * positions) * sizeof(float));
    *scores = offset ? (float *)(offset + walks * positions) : NULL;
    return offset;
}

/* For each sequence b: one query q[b] (heads x head_dim, q_stride floats between
 * sequences) over keys and values at positions 0..lens[b]-1 of the paged cache
 * (k_cache, v_cache: [blocks * block_size, kv_heads, head_dim]; position p sits in slot
 * tables[b, p / block_size] * block_size + p % block_size). out: [batch, heads, head_dim].
 * Softmax in float with the maximum subtracted, as SDPA does; the walk is attend_rows'. */
int ti_paged_decode_attention(const float *q, int64_t batch, int64_t q_stride, int64_t heads,
                              int64_t kv_heads, int64_t head_dim, const float *k_cache,
                              const float *v_cache, const int64_t *tables, int64_t max_blocks,
                              int64_t block_size, const int64_t *lens, float scale, float *out) {
    if (heads % kv_heads) return -2;
    int64_t longest = 1;
    for (int64_t b = 0; b < batch; b++) longest = lens[b] > longest ? lens[b] : longest;
    float *scores;
    int64_t *offset = attention_scratch(1, heads, longest, 1, &scores);
    if (!offset) return -1;
    int rc = 0;
    for (int64_t b = 0; b < batch && rc == 0; b++) {
        if (lens[b] > ATTEND_CHUNK)     /* as the one-sequence step takes it */
            rc = attend_chunked(q + b * q_stride, 1, q_stride, heads, kv_heads, head_dim,
                                k_cache, v_cache, tables + b * max_blocks, block_size,
                                lens[b] - 1, scale, out + b * heads * head_dim,
                                heads * head_dim);
        else
            attend_rows(q + b * q_stride, 1, q_stride, heads, kv_heads, head_dim, k_cache,
                        v_cache, kv_heads * head_dim, tables + b * max_blocks, block_size,
                        lens[b] - 1, scale, out + b * heads * head_dim, heads * head_dim,
                        offset, scores);
    }
    free(offset);
    return rc;
}

/* One sequence's attention split by key-value head across threads.c's pool: each part
 * takes whole groups (a key-value head and its query heads), so every head's scores,
 * softmax and sum are the same operations as in one walk and the output is the same to
 * the bit on any thread count. Below this many multiply-adds (rows x positions x query
 * width) a part costs less than handing it over. With 3 key-value heads on 2 threads the
 * split runs at 2/3 of one walk's time. */
#define ATTEND_SPLIT_MIN 16384

typedef struct {
    const float *q;
    int64_t rows, q_stride, heads, kv_heads, head_dim;
    const float *k_cache, *v_cache;
    const int64_t *table;
    int64_t block_size, start;
    float scale;
    float *out;
    int64_t *offset;   /* kv_heads x (start + rows) */
    float *scores;     /* rows x heads x (start + rows) */
} attend_job;

static void attend_part(void *ctx, int part, int parts) {
    const attend_job *j = (const attend_job *)ctx;
    const int64_t g0 = j->kv_heads * part / parts, g1 = j->kv_heads * (part + 1) / parts;
    if (g0 >= g1) return;
    const int64_t group = j->heads / j->kv_heads, total = j->start + j->rows;
    const int64_t h0 = g0 * group, d = j->head_dim;
    attend_rows(j->q + h0 * d, j->rows, j->q_stride, (g1 - g0) * group, g1 - g0, d,
                j->k_cache + g0 * d, j->v_cache + g0 * d, j->kv_heads * d, j->table,
                j->block_size, j->start, j->scale, j->out + h0 * d, j->heads * d,
                j->offset + g0 * total, j->scores + h0 * j->rows * total);
}

static void attend_heads(const float *q, int64_t rows, int64_t q_stride, int64_t heads,
                         int64_t kv_heads, int64_t head_dim, const float *k_cache,
                         const float *v_cache, const int64_t *table, int64_t block_size,
                         int64_t start, float scale, float *out, int64_t *offset,
                         float *scores) {
    attend_job j = {.q = q, .rows = rows, .q_stride = q_stride, .heads = heads,
                    .kv_heads = kv_heads, .head_dim = head_dim, .k_cache = k_cache,
                    .v_cache = v_cache, .table = table, .block_size = block_size,
                    .start = start, .scale = scale, .out = out, .offset = offset,
                    .scores = scores};
    if (kv_heads > 1 && rows * (start + rows) * heads * head_dim >= ATTEND_SPLIT_MIN
        && ti_run_parts(attend_part, &j, (int)kv_heads) == 0)
        return;
    attend_part(&j, 0, 1);
}

/* ---- long contexts: the positions in chunks ---------------------------------------
 *
 * A row that attends to more than ATTEND_CHUNK positions takes them in chunks of
 * ATTEND_CHUNK (chunk c: positions c x ATTEND_CHUNK on), each chunk a part of its own
 * for the pool's threads: a chunk's scores, their maximum m, exp(score - m), their sum s
 * and the values' sum weighted by them (o, not normalized); then, chunk by chunk in
 * order, out = sum_c exp(m_c - M) o_c / sum_c exp(m_c - M) s_c with M the largest m_c.
 * Split by key-value head alone, SmolLM2's 3 heads on 2 threads ran at 2/3 of one walk's
 * time, each thread reading a third of every cache row, and past a few hundred positions
 * the walk is most of a step; in chunks of 128 its step at 2 threads took 6.9-8.0 ms
 * instead of 8.6-11.0 at 1,900 positions and 4.1-4.6 instead of 4.9-5.3 at 300, one
 * thread unchanged (AMD Zen 4; benchmarks/llm/README.md, "Long contexts"); chunks of 256
 * would leave 300 positions as 256 + 44, less even than the split by head. The chunks
 * are fixed by position, never by the thread count or the step's rows, and merged in one
 * order, so a row's result is the same to the bit on any thread count, in a one-row step
 * or a verification's rows (what a speculative round needs), and in a batch of sequences
 * (ti_paged_decode_attention) as alone. Rows within ATTEND_CHUNK positions keep the one
 * walk (attend_heads), unchanged. */

typedef struct {
    const float *q;
    int64_t rows, q_stride, heads, kv_heads, head_dim;
    const float *k_cache, *v_cache;
    const int64_t *table;
    int64_t block_size, start, chunks;
    float scale;
    float *part_out;    /* rows x heads x chunks x head_dim: o per chunk */
    float *part_max;    /* rows x heads x chunks: m (-inf: the row does not reach it) */
    float *part_sum;    /* rows x heads x chunks: s */
    int64_t *offset;    /* parts x ATTEND_CHUNK */
    float *scores;      /* parts x rows x heads x ATTEND_CHUNK */
} chunk_job;

static void chunk_part(void *ctx, int part, int parts) {
    (void)parts;
    const chunk_job *j = (const chunk_job *)ctx;
    const int64_t c = part, d = j->head_dim, heads = j->heads;
    const int64_t p0 = c * ATTEND_CHUNK, total = j->start + j->rows;
    const int64_t p1 = p0 + ATTEND_CHUNK < total ? p0 + ATTEND_CHUNK : total;
    /* The chunk's rows are read whole, every key-value head at once, as the one walk
     * reads them: one walk per key-value head (4 of a row's 12 lines at a time on
     * SmolLM2) made a one-thread step at 1,900 positions 1.2-1.35x slower. */
    const window_stats stats = {.max = j->part_max + c, .sum = j->part_sum + c,
                                .stride = j->chunks};
    attend_window(j->q, j->rows, j->q_stride, heads, j->kv_heads, d, j->k_cache, j->v_cache,
                  j->kv_heads * d, j->table, j->block_size, j->start, j->scale, p0, p1,
                  j->part_out + c * d, heads * j->chunks * d,
                  j->chunks * d, &stats, j->offset + (int64_t)part * ATTEND_CHUNK,
                  j->scores + (int64_t)part * j->rows * heads * ATTEND_CHUNK);
}

/* chunk_job's scratch for `rows` rows over up to `positions` positions; NULL: no
 * memory. One allocation, freed with free(). */
static void *chunk_scratch(int64_t rows, int64_t heads, int64_t head_dim, int64_t positions,
                           chunk_job *j) {
    const int64_t chunks = (positions + ATTEND_CHUNK - 1) / ATTEND_CHUNK, parts = chunks;
    const size_t stats = (size_t)(rows * heads * chunks);
    char *buf = (char *)malloc((size_t)(parts * ATTEND_CHUNK) * sizeof(int64_t)
                               + (stats * (size_t)head_dim + 2 * stats
                                  + (size_t)(parts * rows * heads * ATTEND_CHUNK))
                               * sizeof(float));
    if (!buf) return NULL;
    j->chunks = chunks;
    j->offset = (int64_t *)buf;
    j->part_out = (float *)(j->offset + parts * ATTEND_CHUNK);
    j->part_max = j->part_out + stats * (size_t)head_dim;
    j->part_sum = j->part_max + stats;
    j->scores = j->part_sum + stats;
    return buf;
}

/* Rows of one sequence that each attend to more than ATTEND_CHUNK positions (row r at
 * position start + r), in chunks; out as attend_rows writes it. -1: no memory. */
static int attend_chunked(const float *q, int64_t rows, int64_t q_stride, int64_t heads,
                          int64_t kv_heads, int64_t head_dim, const float *k_cache,
                          const float *v_cache, const int64_t *table, int64_t block_size,
                          int64_t start, float scale, float *out, int64_t out_stride) {
    chunk_job j = {.q = q, .rows = rows, .q_stride = q_stride, .heads = heads,
                   .kv_heads = kv_heads, .head_dim = head_dim, .k_cache = k_cache,
                   .v_cache = v_cache, .table = table, .block_size = block_size,
                   .start = start, .scale = scale};
    void *buf = chunk_scratch(rows, heads, head_dim, start + rows, &j);
    if (!buf) return -1;
    const int parts = (int)j.chunks;
    if (ti_run_parts(chunk_part, &j, parts) != 0)
        for (int part = 0; part < parts; part++) chunk_part(&j, part, parts);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < heads; h++) {
            const int64_t at = (r * heads + h) * j.chunks;
            const float *m = j.part_max + at, *sum = j.part_sum + at;
            float top = -INFINITY, total = 0.0f;
            for (int64_t c = 0; c < j.chunks; c++) top = m[c] > top ? m[c] : top;
            for (int64_t c = 0; c < j.chunks; c++)
                if (m[c] > -INFINITY) total += expf(m[c] - top) * sum[c];
            float *o = out + r * out_stride + h * head_dim;
            memset(o, 0, (size_t)head_dim * sizeof(float));
            for (int64_t c = 0; c < j.chunks; c++)
                if (m[c] > -INFINITY)
                    axpy(expf(m[c] - top) / total, j.part_out + (at + c) * head_dim, o,
                         head_dim);
        }
    free(buf);
    return 0;
}

/* One sequence's attention for `rows` rows at positions start..: the rows within
 * ATTEND_CHUNK positions in one walk split by key-value head, the longer ones in
 * chunks. -1: no memory. */
static int attend_split(const float *q, int64_t rows, int64_t q_stride, int64_t heads,
                        int64_t kv_heads, int64_t head_dim, const float *k_cache,
                        const float *v_cache, const int64_t *table, int64_t block_size,
                        int64_t start, float scale, float *out, int64_t *offset,
                        float *scores) {
    const int64_t out_stride = heads * head_dim;
    /* rows 0..near-1 attend to at most ATTEND_CHUNK positions */
    int64_t near = ATTEND_CHUNK - start;
    near = near < 0 ? 0 : near > rows ? rows : near;
    if (near > 0)
        attend_heads(q, near, q_stride, heads, kv_heads, head_dim, k_cache, v_cache, table,
                     block_size, start, scale, out, offset, scores);
    if (near == rows) return 0;
    return attend_chunked(q + near * q_stride, rows - near, q_stride, heads, kv_heads,
                          head_dim, k_cache, v_cache, table, block_size, start + near, scale,
                          out + near * out_stride, out_stride);
}

/* ---- a whole step of one sequence ----------------------------------------------- */

enum { TI_FP32 = 0, TI_INT8 = 1, TI_INT4 = 2, TI_AMX_INT8 = 3, TI_Q8 = 4, TI_F16 = 5,
       TI_BF16 = 6 };

/* One linear layer on a native kernel (kernel_candidates.py's Native*Kernel). */
typedef struct {
    int64_t kind, n, k, kp;
    const void *w;
    const float *scales;     /* int8 (both layouts) only */
    const float *bias;       /* may be NULL */
} ti_linear;

typedef struct {
    const float *norm1, *norm2;
    ti_linear qkv, o, gate_up, down;
    float *k_cache, *v_cache;   /* this layer's cache: [blocks * block_size, kv_heads, D] */
} ti_layer;

static int run_linear(const ti_linear *l, const float *x, int64_t rows, float *y) {
    switch (l->kind) {
    case TI_FP32: return ti_par_f32_linear(x, rows, l->k, (const float *)l->w, l->bias, l->n,
                                           l->kp, y);
    case TI_INT8: return ti_par_int8_linear(x, rows, l->k, (const int8_t *)l->w, l->scales,
                                            l->bias, l->n, l->kp, y);
    case TI_AMX_INT8: return ti_par_amx_int8_linear(x, rows, l->k, (const int8_t *)l->w,
                                                    l->scales, l->bias, l->n, l->kp, y);
    case TI_INT4: return ti_par_int4_linear(x, rows, l->k, (const uint8_t *)l->w, l->bias, l->n,
                                            y);
    case TI_Q8: return ti_par_q8_linear(x, rows, l->k, (const int8_t *)l->w, l->bias, l->n, y);
    case TI_F16: return ti_par_f16_linear(x, rows, l->k, (const uint16_t *)l->w, l->bias, l->n,
                                          l->kp, y);
    case TI_BF16: return ti_par_bf16_linear(x, rows, l->k, (const uint16_t *)l->w, l->bias,
                                            l->n, l->kp, y);
    default: return -2;
    }
}

/* A step's shapes and its per-row scratch, h | qkv | attn | delta | gate_up | act, shared
 * by the one-sequence and the several-sequence steps below. */
typedef struct {
    int64_t rows, hidden, heads, kv_heads, head_dim, inner, width;
    float eps;
    const float *cos, *sin_signed;
    float *buf, *h, *qkv, *attn, *delta, *gate_up, *act;
} step_scratch;

/* 0, or -1 without memory (s->buf NULL: nothing to free). */
static int scratch_alloc(step_scratch *s, int64_t rows, int64_t hidden, int64_t heads,
                         int64_t kv_heads, int64_t head_dim, int64_t inner, float eps,
                         const float *cos, const float *sin_signed) {
    const int64_t width = (heads + 2 * kv_heads) * head_dim, q_size = heads * head_dim;
    *s = (step_scratch){.rows = rows, .hidden = hidden, .heads = heads, .kv_heads = kv_heads,
                        .head_dim = head_dim, .inner = inner, .width = width, .eps = eps,
                        .cos = cos, .sin_signed = sin_signed};
    /* On a cache line, as the parts are when the sizes are multiples of 16 floats: the
     * fp32 kernel's 512-bit loads of an activation row then straddle no line. */
    size_t bytes = (size_t)(rows * (2 * hidden + width + q_size + 3 * inner)) * sizeof(float);
    s->buf = (float *)aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!s->buf) return -1;
    s->h = s->buf;
    s->qkv = s->h + rows * hidden;
    s->attn = s->qkv + rows * width;
    s->delta = s->attn + rows * q_size;
    s->gate_up = s->delta + rows * hidden;
    s->act = s->gate_up + rows * 2 * inner;
    return 0;
}

/* A layer up to its attention: the norm, the q/k/v projection into s->qkv and the
 * rotation, keys and values written to their slots. */
static int layer_to_attention(const step_scratch *s, const ti_layer *l, const float *x,
                              const int64_t *positions, const int64_t *slots) {
    ti_rms_norm(x, s->rows, s->hidden, l->norm1, s->eps, s->h);
    int rc = run_linear(&l->qkv, s->h, s->rows, s->qkv);
    return rc ? rc : ti_rope_kv(s->qkv, s->rows, s->heads, s->kv_heads, s->head_dim, s->cos,
                                s->sin_signed, positions, l->k_cache, l->v_cache, slots);
}

/* A layer from its attention's output in s->attn: the output projection and residual,
 * the norm, the MLP and its residual, into x. */
static int layer_from_attention(const step_scratch *s, const ti_layer *l, float *x) {
    const int64_t rows = s->rows, hidden = s->hidden;
    int rc;
    if ((rc = run_linear(&l->o, s->attn, rows, s->delta))) return rc;
    add_into(x, s->delta, rows * hidden);
    ti_rms_norm(x, rows, hidden, l->norm2, s->eps, s->h);
    if ((rc = run_linear(&l->gate_up, s->h, rows, s->gate_up))) return rc;
    ti_silu_mul(s->gate_up, rows, s->inner, s->act);
    if ((rc = run_linear(&l->down, s->act, rows, s->delta))) return rc;
    add_into(x, s->delta, rows * hidden);
    return 0;
}

/* `rows` new tokens of one sequence at positions start.., everything before them cached:
 * a decode step (one row), a speculative verification or a draft's catch-up (a few).
 * x ([rows, hidden]): the tokens' embeddings in, the final norm's output out. table
 * holds the sequence's blocks, every block up to position start + rows - 1. Row i
 * attends to positions 0..start + i. */
int ti_decode_step(const ti_layer *layers, int64_t num_layers, int64_t hidden, int64_t heads,
                   int64_t kv_heads, int64_t head_dim, int64_t inner, float eps, float scale,
                   const float *final_norm, const float *cos, const float *sin_signed,
                   const int64_t *table, int64_t block_size, int64_t start, int64_t rows,
                   float *x) {
    if (heads % kv_heads) return -2;
    step_scratch s;
    /* positions | slots */
    int64_t *positions = (int64_t *)malloc((size_t)(2 * rows) * sizeof(int64_t));
    int no_scratch = scratch_alloc(&s, rows, hidden, heads, kv_heads, head_dim, inner, eps, cos,
                                   sin_signed);
    float *att_scores;
    int64_t *att_offset = attention_scratch(rows, heads, start + rows, kv_heads, &att_scores);
    if (!positions || no_scratch || !att_offset) {
        free(positions);
        free(s.buf);
        free(att_offset);
        return -1;
    }
    int64_t *slots = positions + rows;
    for (int64_t i = 0; i < rows; i++) {
        positions[i] = start + i;
        slots[i] = table[positions[i] / block_size] * block_size + positions[i] % block_size;
    }
    int rc = 0;
    for (int64_t i = 0; i < num_layers && rc == 0; i++) {
        const ti_layer *l = layers + i;
        if ((rc = layer_to_attention(&s, l, x, positions, slots))) break;
        if ((rc = attend_split(s.qkv, rows, s.width, heads, kv_heads, head_dim, l->k_cache,
                               l->v_cache, table, block_size, start, scale, s.attn, att_offset,
                               att_scores)))
            break;
        rc = layer_from_attention(&s, l, x);
    }
    if (rc == 0) ti_rms_norm(x, rows, hidden, final_norm, eps, x);
    free(positions);
    free(s.buf);
    free(att_offset);
    return rc;
}

/* One new token for each of `rows` sequences in one call (batch_decode.py's step): row b
 * at positions[b] of its sequence, its keys and values written to slots[b], attending to
 * the lens[b] positions its block table tables[b * max_blocks ..] covers. The same
 * operations, kernels and order as batch_decode.py's loop over them, without the ~10
 * calls from Python per layer. x ([rows, hidden]): the embeddings in, the final norm's
 * output out. */
int ti_batch_decode_step(const ti_layer *layers, int64_t num_layers, int64_t hidden,
                         int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t inner,
                         float eps, float scale, const float *final_norm, const float *cos,
                         const float *sin_signed, const int64_t *positions,
                         const int64_t *slots, const int64_t *lens, const int64_t *tables,
                         int64_t max_blocks, int64_t block_size, int64_t rows, float *x) {
    if (heads % kv_heads) return -2;
    step_scratch s;
    if (scratch_alloc(&s, rows, hidden, heads, kv_heads, head_dim, inner, eps, cos,
                      sin_signed))
        return -1;
    int rc = 0;
    for (int64_t i = 0; i < num_layers && rc == 0; i++) {
        const ti_layer *l = layers + i;
        if ((rc = layer_to_attention(&s, l, x, positions, slots))) break;
        if ((rc = ti_par_paged_decode_attention(s.qkv, rows, s.width, heads, kv_heads,
                                                head_dim, l->k_cache, l->v_cache, tables,
                                                max_blocks, block_size, lens, scale, s.attn)))
            break;
        rc = layer_from_attention(&s, l, x);
    }
    if (rc == 0) ti_rms_norm(x, rows, hidden, final_norm, eps, x);
    free(s.buf);
    return rc;
}

/* Index of the largest of n floats (the first of equal ones, as torch's argmax). */
static int64_t argmax(const float *v, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* Greedy steps of one sequence with no Python between them (a speculative draft): feed
 * `n_feed` tokens at positions start.. (everything before them cached), take the argmax
 * of the LM head over the last one, feed it back, and so on: out[0..steps) are the
 * argmax tokens. embed: the [vocab, hidden] embedding table; lm_head: a native kernel
 * with lm_head->n = vocab. table covers positions up to start + n_feed + steps - 2. */
int ti_greedy_steps(const ti_layer *layers, int64_t num_layers, int64_t hidden, int64_t heads,
                    int64_t kv_heads, int64_t head_dim, int64_t inner, float eps, float scale,
                    const float *final_norm, const float *cos, const float *sin_signed,
                    const int64_t *table, int64_t block_size, const float *embed,
                    const ti_linear *lm_head, const int64_t *feed, int64_t n_feed,
                    int64_t start, int64_t steps, int64_t *out) {
    float *x = (float *)malloc((size_t)((n_feed > 0 ? n_feed : 1) * hidden + lm_head->n)
                               * sizeof(float));
    if (!x) return -1;
    float *logits = x + (n_feed > 0 ? n_feed : 1) * hidden;
    int64_t rows = n_feed, pos = start;
    for (int64_t r = 0; r < rows; r++)
        memcpy(x + r * hidden, embed + feed[r] * hidden, (size_t)hidden * sizeof(float));
    int rc = 0;
    for (int64_t s = 0; s < steps && rc == 0; s++) {
        rc = ti_decode_step(layers, num_layers, hidden, heads, kv_heads, head_dim, inner, eps,
                            scale, final_norm, cos, sin_signed, table, block_size, pos, rows, x);
        if (rc || (rc = run_linear(lm_head, x + (rows - 1) * hidden, 1, logits))) break;
        out[s] = argmax(logits, lm_head->n);
        pos += rows;
        rows = 1;
        memcpy(x, embed + out[s] * hidden, (size_t)hidden * sizeof(float));
    }
    free(x);
    return rc;
}

/* The greedy choice after each of rows new tokens of one sequence (ids, their rows of
 * embed): one step over the rows (x: scratch of rows x hidden, the final-normed states
 * out), the LM head over every row into logits [rows, vocab] and each row's argmax into
 * out. A plain greedy decode step (one row) and a speculative verification (the
 * proposal's rows) need no more; the LM head is the same native kernel the step's
 * Python path calls, so the choices are those of that path's logits. */
int ti_greedy_rows(const ti_layer *layers, int64_t num_layers, int64_t hidden, int64_t heads,
                   int64_t kv_heads, int64_t head_dim, int64_t inner, float eps, float scale,
                   const float *final_norm, const float *cos, const float *sin_signed,
                   const int64_t *table, int64_t block_size, const ti_linear *lm_head,
                   const float *embed, const int64_t *ids, int64_t start, int64_t rows,
                   float *x, float *logits, int64_t *out) {
    for (int64_t r = 0; r < rows; r++)
        memcpy(x + r * hidden, embed + ids[r] * hidden, (size_t)hidden * sizeof(float));
    int rc = ti_decode_step(layers, num_layers, hidden, heads, kv_heads, head_dim, inner, eps,
                            scale, final_norm, cos, sin_signed, table, block_size, start, rows,
                            x);
    if (rc || (rc = run_linear(lm_head, x, rows, logits))) return rc;
    for (int64_t r = 0; r < rows; r++) out[r] = argmax(logits + r * lm_head->n, lm_head->n);
    return 0;
}

/* ---- structured output ----------------------------------------------------------- */

/* Row rows[i] of logits [., stride] gets -inf at every token t < vocab whose bit in
 * masks[i] (words 32-bit words; bit t % 32 of word t / 32) is clear. A word with every
 * bit set costs one compare; the others are a fixed 32-lane select the compiler
 * vectorizes (a JSON grammar's mask clears nearly every word). */
void ti_apply_token_mask(float *logits, int64_t stride, int64_t vocab, const int64_t *rows,
                         int64_t n, const uint32_t *masks, int64_t words) {
    const int64_t whole = vocab / 32 < words ? vocab / 32 : words;
    for (int64_t i = 0; i < n; i++) {
        float *row = logits + rows[i] * stride;
        const uint32_t *mask = masks + i * words;
        for (int64_t w = 0; w < whole; w++) {
            const uint32_t bits = mask[w];
            if (bits == 0xffffffffu) continue;
            float *lane = row + w * 32;
            for (int j = 0; j < 32; j++) lane[j] = ((bits >> j) & 1u) ? lane[j] : -INFINITY;
        }
        if (whole < words)
            for (int64_t t = whole * 32; t < vocab; t++)
                if (!((mask[whole] >> (t - whole * 32)) & 1u)) row[t] = -INFINITY;
    }
}
