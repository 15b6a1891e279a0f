/* The native kernels on several cores: a small pool of worker threads and the linear
 * layers and paged attention split across it.
 *
 * kernels.c's kernels are single-threaded. A decode step calls one per layer and
 * projection (120 calls a token on a 30-layer model), each tens of microseconds, so the
 * pool is built for short jobs: a job is published by bumping a generation counter, the
 * workers spin on it for a while after each job (a wake-up from sleep costs more than a
 * whole job) and then sleep on a condition variable, so an idle engine costs nothing.
 * A job is cut into a few parts per thread, taken by whichever thread is free, the
 * caller included, which then spins until the parts taken by others are done.
 *
 * A linear layer is split by its output features, on whole tiles of 4: each part reads
 * its own share of the weights (decode is bound by reading them) and quantizes the
 * activations itself (rows x K, small against the weights). With one activation row a
 * part writes its slice of y in place; with several, y's rows are strided, so a part
 * computes into scratch and copies its columns over. Paged attention is split by
 * sequence; decode.c's one-sequence attention by key-value head, or past 128 positions
 * by chunk of positions (ti_run_parts). One thread (the default) calls the kernels
 * directly.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#include "native.h"

#define MAX_THREADS 64
/* Spins a worker waits for the next job before it sleeps: about 100-200 us. */
#define SPIN_LIMIT 4000
/* Spins the caller waits for the parts others took before it yields its core. */
#define WAIT_SPINS 4000

/* Solo (ti_set_solo): every job runs on its caller alone and idle workers sleep at once.
 * For steps run by torch's operators, with the kernels called between them: there the
 * workers' spinning and torch's own threads took each other's cores (SmolLM2 int8, a
 * 128-token prompt on 2 cores: 98 ms with the workers, 72 solo; 512 tokens: 389 / 268). */
static atomic_int solo = 0;

int ti_set_solo(int on) { return atomic_exchange(&solo, on != 0); }

typedef void (*job_fn)(void *ctx, int part, int parts);

/* A job's parts are claimed one at a time from one 64-bit word: the job's generation
 * (32 bits), its part count (16) and the next unclaimed part (16). Whoever is free takes
 * the next part, the caller included, so a worker the system has descheduled delays
 * nothing: its parts go to the others. A worker still holding a previous job's word
 * fails its claim, since the generation moved on. */
static struct {
    int threads;                     /* threads that take parts, the caller included */
    pthread_t workers[MAX_THREADS];
    atomic_uint_fast64_t generation; /* bumped once per job (and to stop) */
    uint_fast64_t start_generation;  /* the generation new workers start from */
    atomic_uint_fast64_t claim;      /* generation << 32 | parts << 16 | next part */
    atomic_int done;                 /* parts finished of the current job */
    atomic_int stop;
    atomic_int sleeping;
    atomic_int busy;                 /* a job is running: another caller runs alone */
    job_fn fn;
    void *ctx;
    pthread_mutex_t mutex;
    pthread_cond_t wake;
} pool = {.threads = 1, .mutex = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

/* Claim and run parts of job `gen` until none is left. */
static void take_parts(uint_fast64_t gen) {
    for (;;) {
        uint_fast64_t word = atomic_load_explicit(&pool.claim, memory_order_acquire);
        uint_fast64_t parts = (word >> 16) & 0xffff, next = word & 0xffff;
        if ((word >> 32) != (gen & 0xffffffffu) || next >= parts) return;
        if (!atomic_compare_exchange_weak_explicit(&pool.claim, &word, word + 1,
                                                   memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        /* The job cannot end before this part is done: fn and ctx are its own. */
        pool.fn(pool.ctx, (int)next, (int)parts);
        atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
    }
}

static void *worker_main(void *arg) {
    (void)arg;
    /* Not the counter's value when this thread first runs: a job published before
     * then would be missed. */
    uint_fast64_t seen = pool.start_generation;
    for (;;) {
        int spins = 0;
        uint_fast64_t now;
        while ((now = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen) {
            if (++spins < SPIN_LIMIT && !atomic_load_explicit(&solo, memory_order_relaxed)) {
                CPU_RELAX();
                continue;
            }
            pthread_mutex_lock(&pool.mutex);
            atomic_fetch_add(&pool.sleeping, 1);
            while (atomic_load(&pool.generation) == seen)
                pthread_cond_wait(&pool.wake, &pool.mutex);
            atomic_fetch_sub(&pool.sleeping, 1);
            pthread_mutex_unlock(&pool.mutex);
            spins = 0;
        }
        seen = now;
        if (atomic_load(&pool.stop)) return NULL;
        take_parts(now);
    }
}

static void publish(void) {
    atomic_fetch_add_explicit(&pool.generation, 1, memory_order_release);
    if (atomic_load(&pool.sleeping)) {
        pthread_mutex_lock(&pool.mutex);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.mutex);
    }
}

/* Run fn(ctx, part, parts) for parts 0..parts-1 on whichever threads are free, the
 * caller among them; returns 0. While another thread's job holds the pool (two engines
 * in one process), returns -1 at once and the caller runs its kernel alone. */
static int run_parts(job_fn fn, void *ctx, int parts) {
    if (atomic_load_explicit(&solo, memory_order_relaxed)) return -1;
    if (atomic_exchange(&pool.busy, 1)) return -1;
    if (parts > 0xffff) parts = 0xffff;
    uint_fast64_t gen = atomic_load(&pool.generation) + 1;
    pool.fn = fn;
    pool.ctx = ctx;
    atomic_store(&pool.done, 0);
    atomic_store_explicit(&pool.claim, ((gen & 0xffffffffu) << 32) | ((uint_fast64_t)parts << 16),
                          memory_order_release);
    publish();
    take_parts(gen);
    /* A part taken by a worker the system has since descheduled (another process wants
     * the core) ends only when that worker runs again: past a normal part's time the
     * caller yields its core instead of spinning on it. */
    for (int spins = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < parts;)
        if (++spins < WAIT_SPINS) CPU_RELAX();
        else sched_yield();
    atomic_store(&pool.busy, 0);
    return 0;
}

int ti_run_parts(void (*fn)(void *ctx, int part, int parts), void *ctx, int parts) {
    if (pool.threads <= 1) return -1;
    return run_parts(fn, ctx, parts);
}

static void stop_workers(void) {
    if (pool.threads <= 1) return;
    atomic_store(&pool.stop, 1);
    publish();
    for (int i = 1; i < pool.threads; i++) pthread_join(pool.workers[i], NULL);
    atomic_store(&pool.stop, 0);
    pool.threads = 1;
}

/* Threads the kernels below use (1: the caller alone). Not to be called while a kernel
 * runs. Returns the count in force. */
int ti_set_threads(int threads) {
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads == pool.threads) return threads;
    stop_workers();
    pool.start_generation = atomic_load(&pool.generation);
    for (int i = 1; i < threads; i++) {
        if (pthread_create(&pool.workers[i], NULL, worker_main, NULL))
            return pool.threads;     /* those started run; fewer than asked */
        pool.threads = i + 1;
    }
    return pool.threads;
}

int ti_get_threads(void) { return pool.threads; }

/* Parts a job of `units` (tiles, sequences) is cut into: a few per thread, so a thread
 * that comes late leaves its share to the others, but not fewer than 2 units a part. */
static int parts_for(int64_t units) {
    int64_t parts = 3 * (int64_t)pool.threads;
    if (parts > units / 2) parts = units / 2;
    return parts < 1 ? 1 : (int)parts;
}

/* ---- linear layers --------------------------------------------------------------- */

enum { KIND_F32 = 0, KIND_INT8 = 1, KIND_INT4 = 2, KIND_AMX_INT8 = 3, KIND_Q8 = 4, KIND_F16 = 5,
       KIND_BF16 = 6 };

/* Output rows a part's share is a multiple of: a weight tile's (amx.c's blocks hold 16). */
static int64_t unit_rows(int kind) { return kind == KIND_AMX_INT8 ? 16 : 4; }

typedef struct {
    int kind;
    const float *x;
    int64_t rows, k, n, kp;
    const void *w;
    const float *scales, *bias;
    float *y;
    atomic_int failed;
} linear_job;

/* Bytes (int8/int4/q8) or floats (fp32) of weights before output feature t (a multiple
 * of unit_rows). */
static const void *weights_at(const linear_job *j, int64_t t) {
    switch (j->kind) {
    case KIND_INT8: return (const int8_t *)j->w + t * j->kp;
    case KIND_AMX_INT8: return (const int8_t *)j->w + (t / 16) * (16 * j->kp + 64);
    case KIND_INT4: return (const uint8_t *)j->w + (t / 4) * (j->k / 32) * 80;
    case KIND_Q8: return (const int8_t *)j->w + (t / 4) * (j->k / 32) * 136;
    case KIND_F16:
    case KIND_BF16: return (const uint16_t *)j->w + t * j->kp;
    default: return (const float *)j->w + t * j->kp;
    }
}

static int call_kernel(const linear_job *j, const void *w, const float *scales,
                       const float *bias, int64_t n, float *y) {
    switch (j->kind) {
    case KIND_INT8: return ti_int8_linear(j->x, j->rows, j->k, (const int8_t *)w, scales, bias,
                                          n, j->kp, y);
    case KIND_INT4: return ti_int4_linear(j->x, j->rows, j->k, (const uint8_t *)w, bias, n, y);
    case KIND_Q8: return ti_q8_linear(j->x, j->rows, j->k, (const int8_t *)w, bias, n, y);
    case KIND_F16: return ti_f16_linear(j->x, j->rows, j->k, (const uint16_t *)w, bias, n,
                                        j->kp, y);
    case KIND_BF16: return ti_bf16_linear(j->x, j->rows, j->k, (const uint16_t *)w, bias, n,
                                          j->kp, y);
    case KIND_AMX_INT8: return ti_amx_int8_linear(j->x, j->rows, j->k, (const int8_t *)w,
                                                  scales, bias, n, j->kp, y);
    default: return ti_f32_linear(j->x, j->rows, j->k, (const float *)w, bias, n, j->kp, y);
    }
}

static void linear_part(void *ctx, int part, int parts) {
    linear_job *j = (linear_job *)ctx;
    int64_t unit = unit_rows(j->kind), tiles = (j->n + unit - 1) / unit;
    int64_t t0 = unit * (tiles * part / parts), t1 = unit * (tiles * (part + 1) / parts);
    if (t1 > j->n) t1 = j->n;
    if (t0 >= t1) return;
    int64_t n = t1 - t0;
    const float *scales = j->scales ? j->scales + t0 : NULL;
    const float *bias = j->bias ? j->bias + t0 : NULL;
    int rc;
    if (j->rows == 1) {
        rc = call_kernel(j, weights_at(j, t0), scales, bias, n, j->y + t0);
    } else {
        float *scratch = (float *)malloc((size_t)(j->rows * n) * sizeof(float));
        if (!scratch) {
            atomic_store(&j->failed, 1);
            return;
        }
        rc = call_kernel(j, weights_at(j, t0), scales, bias, n, scratch);
        for (int64_t r = 0; r < j->rows && !rc; r++)
            memcpy(j->y + r * j->n + t0, scratch + r * n, (size_t)n * sizeof(float));
        free(scratch);
    }
    if (rc) atomic_store(&j->failed, 1);
}

static int run_linear_job(linear_job *j) {
    int64_t unit = unit_rows(j->kind);
    int parts = parts_for((j->n + unit - 1) / unit);
    if (pool.threads <= 1 || parts < 2)
        return call_kernel(j, j->w, j->scales, j->bias, j->n, j->y);
    atomic_store(&j->failed, 0);
    if (run_parts(linear_part, j, parts))
        return call_kernel(j, j->w, j->scales, j->bias, j->n, j->y);
    return atomic_load(&j->failed) ? -1 : 0;
}

/* Both int8 kernels (kernels.c's and amx.c's) take the same arguments. */
static int run_int8_job(int kind, const float *x, int64_t rows, int64_t k, const int8_t *w,
                        const float *wscale, const float *bias, int64_t n, int64_t kp,
                        float *y) {
    linear_job j = {.kind = kind, .x = x, .rows = rows, .k = k, .n = n, .kp = kp, .w = w,
                    .scales = wscale, .bias = bias, .y = y};
    return run_linear_job(&j);
}

int ti_par_int8_linear(const float *x, int64_t rows, int64_t k, const int8_t *w,
                       const float *wscale, const float *bias, int64_t n, int64_t kp,
                       float *y) {
    return run_int8_job(KIND_INT8, x, rows, k, w, wscale, bias, n, kp, y);
}

int ti_par_amx_int8_linear(const float *x, int64_t rows, int64_t k, const int8_t *w,
                           const float *wscale, const float *bias, int64_t n, int64_t kp,
                           float *y) {
    return run_int8_job(KIND_AMX_INT8, x, rows, k, w, wscale, bias, n, kp, y);
}

int ti_par_int4_linear(const float *x, int64_t rows, int64_t k, const uint8_t *w,
                       const float *bias, int64_t n, float *y) {
    linear_job j = {.kind = KIND_INT4, .x = x, .rows = rows, .k = k, .n = n, .w = w,
                    .bias = bias, .y = y};
    return run_linear_job(&j);
}

int ti_par_q8_linear(const float *x, int64_t rows, int64_t k, const int8_t *w,
                     const float *bias, int64_t n, float *y) {
    linear_job j = {.kind = KIND_Q8, .x = x, .rows = rows, .k = k, .n = n, .w = w,
                    .bias = bias, .y = y};
    return run_linear_job(&j);
}

/* The fp32 kernel and its 16-bit-weight twins take the same arguments. */
static int run_tiles_job(int kind, const float *x, int64_t rows, int64_t k, const void *w,
                         const float *bias, int64_t n, int64_t kp, float *y) {
    linear_job j = {.kind = kind, .x = x, .rows = rows, .k = k, .n = n, .kp = kp, .w = w,
                    .bias = bias, .y = y};
    return run_linear_job(&j);
}

int ti_par_f32_linear(const float *x, int64_t rows, int64_t k, const float *w,
                      const float *bias, int64_t n, int64_t kp, float *y) {
    return run_tiles_job(KIND_F32, x, rows, k, w, bias, n, kp, y);
}

int ti_par_f16_linear(const float *x, int64_t rows, int64_t k, const uint16_t *w,
                      const float *bias, int64_t n, int64_t kp, float *y) {
    return run_tiles_job(KIND_F16, x, rows, k, w, bias, n, kp, y);
}

int ti_par_bf16_linear(const float *x, int64_t rows, int64_t k, const uint16_t *w,
                       const float *bias, int64_t n, int64_t kp, float *y) {
    return run_tiles_job(KIND_BF16, x, rows, k, w, bias, n, kp, y);
}

/* ---- paged attention ------------------------------------------------------------- */

typedef struct {
    const float *q;
    int64_t batch, q_stride, heads, kv_heads, head_dim;
    const float *k_cache, *v_cache;
    const int64_t *tables;
    int64_t max_blocks, block_size;
    const int64_t *lens;
    float scale;
    float *out;
    atomic_int failed;
} attention_job;

static void attention_part(void *ctx, int part, int parts) {
    attention_job *j = (attention_job *)ctx;
    int64_t b0 = j->batch * part / parts, b1 = j->batch * (part + 1) / parts;
    if (b0 >= b1) return;
    if (ti_paged_decode_attention(j->q + b0 * j->q_stride, b1 - b0, j->q_stride, j->heads,
                                  j->kv_heads, j->head_dim, j->k_cache, j->v_cache,
                                  j->tables + b0 * j->max_blocks, j->max_blocks,
                                  j->block_size, j->lens + b0, j->scale,
                                  j->out + b0 * j->heads * j->head_dim))
        atomic_store(&j->failed, 1);
}

int ti_par_paged_decode_attention(const float *q, int64_t batch, int64_t q_stride,
                                  int64_t heads, int64_t kv_heads, int64_t head_dim,
                                  const float *k_cache, const float *v_cache,
                                  const int64_t *tables, int64_t max_blocks,
                                  int64_t block_size, const int64_t *lens, float scale,
                                  float *out) {
    if (pool.threads <= 1 || batch < 2)
        return ti_paged_decode_attention(q, batch, q_stride, heads, kv_heads, head_dim,
                                         k_cache, v_cache, tables, max_blocks, block_size,
                                         lens, scale, out);
    if (heads % kv_heads) return -2;
    attention_job j = {.q = q, .batch = batch, .q_stride = q_stride, .heads = heads,
                       .kv_heads = kv_heads, .head_dim = head_dim, .k_cache = k_cache,
                       .v_cache = v_cache, .tables = tables, .max_blocks = max_blocks,
                       .block_size = block_size, .lens = lens, .scale = scale, .out = out};
    atomic_store(&j.failed, 0);
    if (run_parts(attention_part, &j, (int)(batch < 4 * pool.threads ? batch
                                                                    : 4 * pool.threads)))
        return ti_paged_decode_attention(q, batch, q_stride, heads, kv_heads, head_dim,
                                         k_cache, v_cache, tables, max_blocks, block_size,
                                         lens, scale, out);
    return atomic_load(&j.failed) ? -1 : 0;
}
