/* What kernels.c, decode.c and threads.c call of each other: one set of declarations,
 * so the files compiled into one library cannot disagree on a signature. */
#ifndef TI_NATIVE_H
#define TI_NATIVE_H
#include <stdint.h>

/* kernels.c: single-threaded linear layers, y[rows, n] = x[rows, k] @ W.T + b. */
int ti_int8_linear(const float *x, int64_t rows, int64_t k, const int8_t *w,
                   const float *wscale, const float *bias, int64_t n, int64_t kp, float *y);
int ti_int4_linear(const float *x, int64_t rows, int64_t k, const uint8_t *w,
                   const float *bias, int64_t n, float *y);
int ti_f32_linear(const float *x, int64_t rows, int64_t k, const float *w,
                  const float *bias, int64_t n, int64_t kp, float *y);
/* The f32 setting from which the fp32 kernel's several-row passes run on 512-bit
 * registers (AVX-512); 0 where the build has none. */
int64_t ti_f32_wide_from(void);
int ti_q8_linear(const float *x, int64_t rows, int64_t k, const int8_t *w,
                 const float *bias, int64_t n, float *y);
/* fp32 arithmetic on weights that are exactly fp16 / bf16 numbers, stored in 16 bits in
 * the fp32 kernel's layout: its results, bit for bit. */
int ti_f16_linear(const float *x, int64_t rows, int64_t k, const uint16_t *w,
                  const float *bias, int64_t n, int64_t kp, float *y);
int ti_bf16_linear(const float *x, int64_t rows, int64_t k, const uint16_t *w,
                   const float *bias, int64_t n, int64_t kp, float *y);

/* kernels.c: the int8 kernel's activation quantization (per block of 32, an integer
 * multiplier 1..levels of one scale per row), shared with amx.c. */
int ti_i8_levels(int64_t kp);
/* How many bytes ahead each kernel family prefetches its weight stream (kernels.c). For
 * the fp32 kernel at several rows, below ti_f32_wide_from(): its 256-bit tiles, fetching
 * the next tile or not (0); from it: its 512-bit passes, the first fetching that many
 * bytes ahead. */
enum { TI_PREFETCH_INT8, TI_PREFETCH_INT4, TI_PREFETCH_AMX, TI_PREFETCH_Q8, TI_PREFETCH_F32,
       TI_PREFETCH_KINDS };
int64_t ti_prefetch_bytes(int kind);
int64_t ti_set_prefetch_for(int kind, int64_t bytes);
void ti_quantize_i8_blocks(const float *x, int64_t rows, int64_t k, int64_t kp, int levels,
                           int8_t *q, int16_t *m, float *scale);

/* amx.c: the int8 linear layer on AMX tiles, its weights in layout.py's amx_int8_tiles;
 * -3 where this build or CPU has no AMX. ti_amx_available: 1 where it runs. */
int ti_amx_available(void);
int ti_amx_int8_linear(const float *x, int64_t rows, int64_t k, const int8_t *w,
                       const float *wscale, const float *bias, int64_t n, int64_t kp, float *y);

/* decode.c: one query per sequence over its paged cache. */
int ti_paged_decode_attention(const float *q, int64_t batch, int64_t q_stride, int64_t heads,
                              int64_t kv_heads, int64_t head_dim, const float *k_cache,
                              const float *v_cache, const int64_t *tables, int64_t max_blocks,
                              int64_t block_size, const int64_t *lens, float scale, float *out);

/* threads.c: the same linear layers split across the worker threads (ti_set_threads). */
int ti_par_int8_linear(const float *x, int64_t rows, int64_t k, const int8_t *w,
                       const float *wscale, const float *bias, int64_t n, int64_t kp, float *y);
int ti_par_int4_linear(const float *x, int64_t rows, int64_t k, const uint8_t *w,
                       const float *bias, int64_t n, float *y);
int ti_par_amx_int8_linear(const float *x, int64_t rows, int64_t k, const int8_t *w,
                           const float *wscale, const float *bias, int64_t n, int64_t kp,
                           float *y);
int ti_par_f32_linear(const float *x, int64_t rows, int64_t k, const float *w,
                      const float *bias, int64_t n, int64_t kp, float *y);
int ti_par_q8_linear(const float *x, int64_t rows, int64_t k, const int8_t *w,
                     const float *bias, int64_t n, float *y);
int ti_par_f16_linear(const float *x, int64_t rows, int64_t k, const uint16_t *w,
                      const float *bias, int64_t n, int64_t kp, float *y);
int ti_par_bf16_linear(const float *x, int64_t rows, int64_t k, const uint16_t *w,
                       const float *bias, int64_t n, int64_t kp, float *y);
int ti_par_paged_decode_attention(const float *q, int64_t batch, int64_t q_stride,
                                  int64_t heads, int64_t kv_heads, int64_t head_dim,
                                  const float *k_cache, const float *v_cache,
                                  const int64_t *tables, int64_t max_blocks,
                                  int64_t block_size, const int64_t *lens, float scale,
                                  float *out);
/* threads.c: fn(ctx, part, parts) for every part on the pool's threads, the caller's
 * included; -1 (nothing run) with one thread or while another caller's job holds it. */
int ti_run_parts(void (*fn)(void *ctx, int part, int parts), void *ctx, int parts);
int ti_get_threads(void);
#endif
