/* Kernels for a decode step on a CPU, float32 (loaded by __init__.py; design: docs/design.md).
 *
 * A decode step reads every weight once, so its products are bound by memory bandwidth: these
 * read each (out, in) row-major weight as one stream per thread (token_lab_gemm_rows). Each
 * output is the float32 sum of its row's products in dot()'s order, with fused multiply-adds
 * throughout: one order and one rounding of arithmetic for every kernel that sums a row.
 *
 * Vector width: GCC's vector extension, lowered to what the CPU has. Threads: see split(). */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- threads, or one
 * A product splits its rows evenly between torch's threads (torch.get_num_threads()) on the
 * OpenMP runtime torch already loaded (libgomp.so.1), so torch's operators and these share one
 * pool: on an idle 2-core machine two threads read SmolLM2's matrices 1.5x faster than one
 * thread (and than MKL's sgemv, which runs them on one). But an OpenMP team waits at its
 * barrier for every thread, and with other processes on the cores it waited for a descheduled
 * thread's time slice: 2 threads then ran 10x slower than one. So each product times itself,
 * and the next goes on one thread or all of them, whichever's recent cost per byte is lower; one
 * product in 256 tries the other, to notice when the machine changes (a record for each kernel
 * and size: two threads paid off for the LM head sooner than for a small matrix). Either way
 * every output is the same dot product: the choice changes no bits. */
typedef void (*range_fn)(void *ctx, int64_t begin, int64_t end);

typedef struct {
    double ns_per_byte[2];  /* recent cost on one thread and on all; 0: not measured yet */
    unsigned long calls;
} costs_t;

/* One record per kernel and power of two of bytes read: a small matrix and the LM head differ
 * in which is faster. */
static costs_t rows_costs[48], attend_costs[48];
static inline costs_t *by_size(costs_t *table, int64_t bytes) {
    const int b = bytes > 1 ? 63 - __builtin_clzll((unsigned long long)bytes) : 0;
    return &table[b < 47 ? b : 47];
}

/* A child forked from a process whose OpenMP pool has started cannot use that pool (GNU
 * libgomp's threads are not in the child and its team would wait for them forever): the child
 * runs every product on one thread, as torch does its own operators there. */
static int forked;
static void on_fork_child(void) { forked = 1; }
__attribute__((constructor)) static void watch_forks(void) { pthread_atfork(NULL, NULL, on_fork_child); }

static inline double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

/* Whether the next call with these costs runs on one thread (0) or all (1): the one whose recent
 * cost per byte is lower, the other one call in 256. */
static int pick_threads(costs_t *costs) {
    unsigned long k = __atomic_fetch_add(&costs->calls, 1, __ATOMIC_RELAXED);
    const double one = costs->ns_per_byte[0], two = costs->ns_per_byte[1];
    int pick = two == 0.0 ? 1 : one == 0.0 ? 0 : two <= one;
    return k % 256 == 255 ? !pick : pick;
}

/* A call on `pick` that began at t0 and read `bytes`: into its recent cost. */
static void record_cost(costs_t *costs, int pick, double t0, int64_t bytes) {
    double c = (now_ns() - t0) / (double)(bytes > 0 ? bytes : 1);
    const double old = costs->ns_per_byte[pick];
    /* One call counts at most twice the estimate: a thread of the team preempted once (the
     * step's other thread waits at its barrier) would otherwise switch every call to one thread
     * until the next look at two, 256 calls on; a machine that stays busy moves it in a few. */
    if (old > 0.0 && c > 2.0 * old) c = 2.0 * old;
    /* A data race between callers on different threads only blurs the estimate. */
    costs->ns_per_byte[pick] = old == 0.0 ? c : 0.5 * old + 0.5 * c;
}

/* fn over [0, n) on one thread or `threads`; bytes: what it reads, for its cost. */
static void split(range_fn fn, void *ctx, int64_t n, int64_t bytes, int threads, costs_t *costs) {
    if (threads <= 1 || n < 2 || forked) {
        fn(ctx, 0, n);
        return;
    }
    const int pick = pick_threads(costs);
    const double t = now_ns();
    if (pick) {
        #pragma omp parallel num_threads(threads)
        {
            const int i = omp_get_thread_num(), m = omp_get_num_threads();
            fn(ctx, n * i / m, n * (i + 1) / m);
        }
    } else {
        fn(ctx, 0, n);
    }
    record_cost(costs, pick, t, bytes);
}

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p) { v8 v; memcpy(&v, p, sizeof v); return v; }
/* a * b + c in each lane, rounded once: written out (the file is compiled with
 * -ffp-contract=off) so that every kernel rounds the same way, whatever the compiler would
 * have contracted; GCC makes it one vector FMA where the CPU has them. */
static inline v8 fma8(v8 a, v8 b, v8 c) {
    v8 r;
    for (int l = 0; l < 8; ++l) r[l] = fmaf(a[l], b[l], c[l]);
    return r;
}
static inline float sum8(v8 v) {
    float s = 0.0f;
    for (int k = 0; k < 8; ++k) s += v[k];
    return s;
}

/* Ask for the two cache lines AHEAD bytes past p: a weight row read once a step comes from DRAM,
 * and the hardware's prefetcher alone kept a thread's product at about half its speed from the cache.
 * Asked as the row is read (not all at its start), two threads summed float32 rows in 2 MiB pages
 * at 33-34 GB/s against 28-29 (bench/measured/cpu-quant-smollm2-135m.md). */
enum { AHEAD = 4096 };
static inline void ahead(const float *p) {
    __builtin_prefetch((const char *)p + AHEAD);
    __builtin_prefetch((const char *)p + AHEAD + 64);
}

/* The dot product of r and x (length n), in the one order every product here uses: four 8-lane
 * accumulators over chunks of 32, then chunks of 8 into the first, added as (a + b) + (c + d)
 * and across lanes, then the tail; fused multiply-adds throughout. */
static inline float dot(const float *r, const float *x, int64_t n) {
    v8 a = {0}, b = {0}, c = {0}, d = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        ahead(r + i);
        a = fma8(load8(r + i), load8(x + i), a);
        b = fma8(load8(r + i + 8), load8(x + i + 8), b);
        c = fma8(load8(r + i + 16), load8(x + i + 16), c);
        d = fma8(load8(r + i + 24), load8(x + i + 24), d);
    }
    for (; i + 8 <= n; i += 8) a = fma8(load8(r + i), load8(x + i), a);
    float s = sum8((a + b) + (c + d));
    for (; i < n; ++i) s = fmaf(r[i], x[i], s);
    return s;
}

/* Two dot products with one row r (x0, x1: two rows of activations), each in dot()'s order:
 * each 32-float chunk of r is loaded once for both. */
static inline void dot2(const float *r, const float *x0, const float *x1, int64_t n, float *s0, float *s1) {
    v8 a = {0}, b = {0}, c = {0}, d = {0}, e = {0}, f = {0}, g = {0}, h = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        ahead(r + i);
        const v8 w0 = load8(r + i), w1 = load8(r + i + 8), w2 = load8(r + i + 16), w3 = load8(r + i + 24);
        a = fma8(w0, load8(x0 + i), a); b = fma8(w1, load8(x0 + i + 8), b);
        c = fma8(w2, load8(x0 + i + 16), c); d = fma8(w3, load8(x0 + i + 24), d);
        e = fma8(w0, load8(x1 + i), e); f = fma8(w1, load8(x1 + i + 8), f);
        g = fma8(w2, load8(x1 + i + 16), g); h = fma8(w3, load8(x1 + i + 24), h);
    }
    for (; i + 8 <= n; i += 8) {
        const v8 w0 = load8(r + i);
        a = fma8(w0, load8(x0 + i), a);
        e = fma8(w0, load8(x1 + i), e);
    }
    float t0 = sum8((a + b) + (c + d)), t1 = sum8((e + f) + (g + h));
    for (; i < n; ++i) {
        t0 = fmaf(r[i], x0[i], t0);
        t1 = fmaf(r[i], x1[i], t1);
    }
    *s0 = t0;
    *s1 = t1;
}

/* Y = X W^T: W (out, in) row-major with rows `stride` floats apart, X (rows, in) with rows
 * x_stride floats apart, Y (rows, out). Each weight row is read once, in order, for every row
 * of X (two at a time share its loads): the matrix streams from memory as one sequence per
 * thread, which read ~2x faster than four interleaved row streams on a busy 2-core machine.
 * One row of X (a decode step of one run) is the same code: a row's numbers are the same bits
 * whoever else is in the step. */
typedef struct { const float *w, *x; float *y; int64_t rows, out, in, stride, x_stride; } rows_t;

static void rows_range(void *ctx, int64_t begin, int64_t end) {
    const rows_t *a = ctx;
    for (int64_t o = begin; o < end; ++o) {
        const float *wr = a->w + o * a->stride;
        int64_t r = 0;
        for (; r + 2 <= a->rows; r += 2)
            dot2(wr, a->x + r * a->x_stride, a->x + (r + 1) * a->x_stride, a->in,
                 a->y + r * a->out + o, a->y + (r + 1) * a->out + o);
        if (r < a->rows) a->y[r * a->out + o] = dot(wr, a->x + r * a->x_stride, a->in);
    }
}

void token_lab_gemm_rows(const float *w, const float *x, float *y, int64_t rows, int64_t out,
                         int64_t in, int64_t stride, int64_t x_stride, int threads) {
    rows_t a = {w, x, y, rows, out, in, stride, x_stride};
    split(rows_range, &a, out, out * stride * (int64_t)sizeof(float), threads,
          by_size(rows_costs, out * stride * (int64_t)sizeof(float)));
}

/* y = W x for one row of activations: a decode step of one run. */
void token_lab_gemv(const float *w, const float *x, float *y, int64_t out, int64_t in,
                    int64_t stride, int threads) {
    token_lab_gemm_rows(w, x, y, 1, out, in, stride, in, threads);
}

/* ---------------------------------------------------------------- attention, one query
 * Attention of one query per head over its keys, float32: a decode row.
 *
 * Key j of kv head g lies at k + row(j) * k_pos + g * k_head (likewise v), where row(j) = j for
 * keys read in place, or, through a block table, blocks[j / block_size] * block_size + j %
 * block_size (the paged pool's slots). Keys `first` .. L-1 are visible (a sliding window starts
 * past 0). Query head h reads kv head h / (heads / kv_heads) (grouped-query attention). Scores,
 * softmax and the weighted sum in float32 like SDPA's CPU kernel, in one order whatever the
 * layout, so a row's output is the same bits read in place or through blocks. SDPA's dispatch
 * costs ~100 us a call for one query; this is one pass over the keys and values. */
static void attend_head(const float *qh, const float *k, const float *v, float *o, float *p,
                        const int64_t *blocks, int64_t block_size, int64_t first, int64_t L,
                        int64_t k_pos, int64_t v_pos, int64_t d, float scale) {
    float m = -INFINITY;
    for (int64_t j = first; j < L; ++j) {
        const int64_t row = blocks ? blocks[j / block_size] * block_size + j % block_size : j;
        p[j] = dot(k + row * k_pos, qh, d) * scale;
        if (p[j] > m) m = p[j];
    }
    float z = 0.0f;
    for (int64_t j = first; j < L; ++j) { p[j] = expf(p[j] - m); z += p[j]; }
    for (int64_t i = 0; i < d; ++i) o[i] = 0.0f;
    for (int64_t j = first; j < L; ++j) {
        const int64_t row = blocks ? blocks[j / block_size] * block_size + j % block_size : j;
        const float w = p[j] / z, *vj = v + row * v_pos;
        for (int64_t i = 0; i < d; ++i) o[i] += w * vj[i];
    }
}

/* rows queries q (rows, heads, d) -> out (rows, heads, d). Row r sees keys first[r] .. L[r]-1
 * through its block table blocks + r * n_blocks, or (blocks NULL, one row) keys 0 .. L-1 in place. */
typedef struct {
    const float *q, *k, *v;
    float *out;
    const int64_t *blocks, *first, *L;
    int64_t n_blocks, block_size, max_L, k_pos, k_head, v_pos, v_head, heads, rep, d;
    float scale;
} attend_t;

static void attend_range(void *ctx, int64_t begin, int64_t end) {
    const attend_t *a = ctx;
    float *p = malloc(sizeof(float) * (a->max_L > 0 ? a->max_L : 1));
    if (!p) abort();
    for (int64_t rh = begin; rh < end; ++rh) {
        const int64_t r = rh / a->heads, g = rh % a->heads / a->rep;
        attend_head(a->q + rh * a->d, a->k + g * a->k_head, a->v + g * a->v_head, a->out + rh * a->d, p,
                    a->blocks ? a->blocks + r * a->n_blocks : NULL, a->block_size, a->first[r], a->L[r],
                    a->k_pos, a->v_pos, a->d, a->scale);
    }
    free(p);
}

void token_lab_attend(const float *q, const float *k, const float *v, float *out, int64_t rows,
                      const int64_t *blocks, int64_t n_blocks, int64_t block_size,
                      const int64_t *first, const int64_t *L, int64_t max_L,
                      int64_t k_pos, int64_t k_head, int64_t v_pos, int64_t v_head,
                      int64_t heads, int64_t kv_heads, int64_t d, float scale, int threads) {
    attend_t a = {q, k, v, out, blocks, first, L, n_blocks, block_size, max_L,
                  k_pos, k_head, v_pos, v_head, heads, heads / kv_heads, d, scale};
    split(attend_range, &a, rows * heads, rows * max_L * kv_heads * d * 2 * (int64_t)sizeof(float), threads,
          by_size(attend_costs, rows * max_L * kv_heads * d * 2 * (int64_t)sizeof(float)));
}

/* ---------------------------------------------------------------- RMSNorm
 * RMSNorm of n rows of length d, float32: y = x / sqrt(mean(x^2) + eps) * w. torch's CPU
 * rms_norm is five operators (pow, mean, add, rsqrt, mul) for one decode row. */
void token_lab_rms_norm(const float *x, const float *w, float *y, int64_t n, int64_t d, float eps) {
    for (int64_t r = 0; r < n; ++r) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        v8 a = {0}, b = {0};
        int64_t i = 0;
        for (; i + 16 <= d; i += 16) {
            const v8 x0 = load8(xr + i), x1 = load8(xr + i + 8);
            a += x0 * x0; b += x1 * x1;
        }
        float s = sum8(a + b);
        for (; i < d; ++i) s += xr[i] * xr[i];
        const float inv = 1.0f / sqrtf(s / (float)d + eps);
        for (i = 0; i < d; ++i) yr[i] = xr[i] * inv * w[i];
    }
}

/* ---------------------------------------------------------------- RoPE, and the cache write
 * Rows of a fused q/k/v projection, qkv (n, (heads + 2 kv_heads) * d): each q and k head rotated
 * by its row's tables, cos and signed_sin (n, d) ("rotate half": dimension i pairs with
 * i + d/2, x * cos + roll(x, d/2) * signed_sin), q into q_out (n, heads, d), k and v into the
 * pool's slot for the row (k_pool, v_pool: (slots, kv_heads, d)). Seven operators of torch's for
 * a decode row, in one pass. */
static inline void rotate(const float *x, const float *c, const float *s, float *out, int64_t d) {
    const int64_t half = d / 2;
    for (int64_t i = 0; i < d; ++i) out[i] = x[i] * c[i] + x[(i + half) % d] * s[i];
}

void token_lab_rope_store(const float *qkv, const float *cos, const float *signed_sin, float *q_out,
                          float *k_pool, float *v_pool, const int64_t *slots, int64_t n,
                          int64_t heads, int64_t kv_heads, int64_t d) {
    const int64_t width = (heads + 2 * kv_heads) * d;
    for (int64_t r = 0; r < n; ++r) {
        const float *row = qkv + r * width, *c = cos + r * d, *s = signed_sin + r * d;
        for (int64_t h = 0; h < heads; ++h) rotate(row + h * d, c, s, q_out + (r * heads + h) * d, d);
        float *k = k_pool + slots[r] * kv_heads * d, *v = v_pool + slots[r] * kv_heads * d;
        for (int64_t g = 0; g < kv_heads; ++g) rotate(row + (heads + g) * d, c, s, k + g * d, d);
        memcpy(v, row + (heads + kv_heads) * d, sizeof(float) * kv_heads * d);
    }
}

/* ---------------------------------------------------------------- gated activation
 * x (n, 2f) = [gate | up] -> y (n, f) = act(gate) * up: SiLU (gelu 0) or tanh-approximated GELU
 * (gelu 1, Gemma's GeGLU). */
static inline float act(float a, int gelu) {
    return gelu ? 0.5f * a * (1.0f + tanhf(0.7978845608028654f * (a + 0.044715f * a * a * a)))
                : a / (1.0f + expf(-a));
}

void token_lab_glu(const float *x, float *y, int64_t n, int64_t f, int gelu) {
    for (int64_t r = 0; r < n; ++r) {
        const float *g = x + r * 2 * f, *u = g + f;
        float *o = y + r * f;
        for (int64_t i = 0; i < f; ++i) o[i] = act(g[i], gelu) * u[i];
    }
}

/* ---------------------------------------------------------------- a step's statistics
 * What a step reports of each row of its logits x (rows, V) (step_stats.py): in one pass, the k
 * largest, largest first and equal values by index (so the first is argmax's choice); in another,
 * given e = exp(x - max), the sums z = sum(e) and m = sum(e * x), the products in float32 and the
 * sums in float64, and how many logits exceed the chosen token's. found: k, or 0 where a row has
 * a NaN (torch.topk ranks NaNs first: the caller then uses it). */
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));

/* Insert v (index j) among the n (< k, or k: then it displaces the last) sorted val/id. */
static inline int64_t keep_top(float *val, int64_t *id, int64_t n, int64_t k, float v, int64_t j) {
    int64_t i = n < k ? n++ : k - 1;
    for (; i > 0 && v > val[i - 1]; --i) { val[i] = val[i - 1]; id[i] = id[i - 1]; }
    val[i] = v;
    id[i] = j;
    return n;
}

void token_lab_top_k(const float *x, int64_t rows, int64_t V, int64_t k, int64_t *ids, float *vals,
                     int64_t *found) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * V;
        int64_t *id = ids + r * k, n = 0, j = 0, nan = 0;
        float *val = vals + r * k;
        for (; j < V && n < k; ++j) {
            if (xr[j] != xr[j]) nan = 1;
            else n = keep_top(val, id, n, k, xr[j], j);
        }
        /* Then 32 at a time: only a block with a value above the k-th (or a NaN) is looked into. */
        for (; j + 32 <= V && !nan; j += 32) {
            const float t = val[k - 1];
            v8i hit = {0};
            for (int b = 0; b < 32; b += 8) {
                const v8 a = load8(xr + j + b);
                hit |= (a > t) | (a != a);
            }
            int64_t lanes[4];
            memcpy(lanes, &hit, sizeof lanes);
            if (!(lanes[0] | lanes[1] | lanes[2] | lanes[3])) continue;
            for (int64_t i = j; i < j + 32; ++i) {
                if (xr[i] != xr[i]) nan = 1;
                else if (xr[i] > val[k - 1]) n = keep_top(val, id, n, k, xr[i], i);
            }
        }
        for (; j < V; ++j) {
            if (xr[j] != xr[j]) nan = 1;
            else if (xr[j] > val[k - 1]) n = keep_top(val, id, n, k, xr[j], j);
        }
        found[r] = nan ? 0 : n;  /* torch.topk ranks a NaN first */
    }
}

static inline v4 load4(const float *p) { v4 v; memcpy(&v, p, sizeof v); return v; }

void token_lab_row_sums(const float *x, const float *e, int64_t rows, int64_t V, const int64_t *chosen,
                        double *z, double *m, int64_t *above) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * V, *er = e + r * V, c = xr[chosen[r]];
        v4d z0 = {0}, z1 = {0}, m0 = {0}, m1 = {0};  /* two running sums each: independent additions */
        v8i n8 = {0};  /* each lane's count of logits above c (a true comparison is -1) */
        int64_t j = 0, count = 0;
        for (; j + 8 <= V; j += 8) {
            const v4 e0 = load4(er + j), e1 = load4(er + j + 4);
            n8 -= load8(xr + j) > c;
            z0 += __builtin_convertvector(e0, v4d);
            z1 += __builtin_convertvector(e1, v4d);
            m0 += __builtin_convertvector(e0 * load4(xr + j), v4d);
            m1 += __builtin_convertvector(e1 * load4(xr + j + 4), v4d);
        }
        double zs = 0.0, ms = 0.0;
        for (; j < V; ++j) { zs += er[j]; ms += (double)(er[j] * xr[j]); count += xr[j] > c; }
        for (int l = 0; l < 4; ++l) { zs += z0[l] + z1[l]; ms += m0[l] + m1[l]; }
        for (int l = 0; l < 8; ++l) count += n8[l];
        z[r] = zs;
        m[r] = ms;
        above[r] = count;
    }
}

#include "quant.c"

/* ---------------------------------------------------------------- a whole decode step
 * Every layer and the LM head for n rows, each one decoding run's new token, in one call:
 *
 *   per layer: x = RMSNorm(h) -> qkv = x Wqkv^T (+ bias) -> [each q and k head RMSNormed]
 *              -> q, k rotated; k, v into the pool -> attention of each row over its run's keys
 *              -> h += [RMSNorm](att Wo^T)
 *              -> x = RMSNorm(h) -> g = act(x Wgate^T) * (x Wup^T) -> h += [RMSNorm](g Wdown^T)
 *   then: logits = RMSNorm(h) Whead^T
 * ([...]: where the layer has that norm: Qwen3's q/k norms, Gemma 3's; Gemma's norms after each
 * branch.)
 *
 * The same functions, in the same order for every output, as the calls above (rows_range, dot,
 * attend_head, token_lab_rms_norm, rotate, act), so its numbers are the same bits as the
 * model's kernel-by-kernel path, and a row's the same alone or beside others. What it saves is
 * the rest of that path: ~1,000 small operators and ~120 thread-team starts a step. The team
 * starts once; each stage's work is handed out in chunks from a counter (a thread that gets
 * less of the CPU takes fewer) and the threads meet at a barrier where a stage reads what
 * another wrote: five a layer, and one more after each branch a layer norms. Whether the step
 * runs on one thread or all is chosen as for a product (split()), by the step's recent cost per
 * byte. */

enum { L_ATTN_NORM, L_WQKV, L_BQKV, L_Q_NORM, L_K_NORM, L_WO, L_POST_ATTN_NORM, L_FFN_NORM, L_W13, L_W2,
       L_POST_FFN_NORM, L_K_POOL, L_V_POOL, L_SLIDING, L_FIELDS };
enum { D_N, D_HIDDEN, D_HEADS, D_KV_HEADS, D_HEAD_DIM, D_FFN, D_VOCAB, D_LAYERS, D_GELU, D_N_BLOCKS,
       D_BLOCK_SIZE, D_CTX_OFFSET, D_MAX_L, D_FIELDS };
enum { P_H, P_COS, P_SIN, P_COS_LOCAL, P_SIN_LOCAL, P_SLOTS, P_BLOCKS, P_FIRST, P_FIRST_LOCAL, P_LENGTHS,
       P_NORM, P_HEAD, P_LOGITS, P_FIELDS };

typedef struct {
    const int64_t *dims, *layers;
    void *const *ptrs;
    float eps, scale;
    /* shared scratch: (n, width), (n, heads, d) twice, (n, hidden), (n, 2 ffn), (n, ffn) */
    float *qkv, *q, *att, *y, *gu, *g;
    int64_t *counters;                   /* one per stage, handing out its chunks */
    int64_t arrived, passed;             /* the barrier's: threads arrived, barriers passed */
} step_t;

/* Chunks of [0, total) claimed in turn from *counter until none are left: each a share of what is
 * left (a quarter of it for two threads, then an eighth...), at least `chunk`. A thread reads
 * long runs of a weight (a stream the prefetchers keep up with; 64 KiB chunks in turn read
 * float32 rows at 26-27 GB/s against 33-34 for each thread's half) and the last small chunks
 * still even out the threads at the barrier. */
static inline int64_t claim(int64_t *counter, int64_t total, int64_t chunk, int nth, int64_t *end) {
    int64_t b = __atomic_load_n(counter, __ATOMIC_RELAXED), e;
    do {
        if (b >= total) return b;
        const int64_t share = (total - b) / (2 * nth);
        e = b + (share > chunk ? share : chunk);
        if (e > total) e = total;
    } while (!__atomic_compare_exchange_n(counter, &b, e, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    *end = e;
    return b;
}
#define CHUNKS(counter, total, chunk, nth, b, e) \
    for (int64_t b, e; (b = claim(counter, total, chunk, nth, &e)) < (total);)

/* The fewest rows of a product a chunk takes: about 64 KiB of the weight as stored, at least 8
 * rows (a stage's first chunks are larger: claim()). Counted in float32 rows, a Q4_1 chunk was
 * 10 KiB and SmolLM2's step took ~8,000 of them; by the bytes stored the step is 8-12% faster
 * (32 KiB the same, 256 KiB 10% slower: the last chunks of a stage leave a thread waiting at its
 * barrier; measured with chunks all of this size). */
static inline int64_t chunk_rows(const int64_t *w) {
    const int64_t r = 65536 / (weight_bytes(w) / w[W_OUT]);
    return r < 8 ? 8 : r;
}

/* Where a stage reads what another thread wrote: all the step's threads meet here. The last to
 * arrive lets the others go; they spin up to 50 us (a stage's threads arrive microseconds apart),
 * then yield their core at each look for up to 2 ms (a thread of the team may be off its core,
 * and others may run there), then sleep 50 us a look (a thread long descheduled, on a busy machine:
 * the waiting one holds no core meanwhile). libgomp's barrier sleeps in the kernel soon where a
 * process has more threads than cores (the page's, the callers'): with it SmolLM2's step (150
 * barriers) took 8.3-9.1 ms against 6.7-7.5 with this one on an idle 2-core Xeon, and the same
 * (~13 ms) beside a CPU-bound process. */
enum { SPIN_NS = 50000, YIELD_NS = 2000000 };
static void barrier(step_t *s, int nth) {
    if (nth <= 1) return;
    const int64_t passed = __atomic_load_n(&s->passed, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&s->arrived, 1, __ATOMIC_ACQ_REL) == nth) {
        __atomic_store_n(&s->arrived, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&s->passed, passed + 1, __ATOMIC_RELEASE);
        return;
    }
    const double start = now_ns();
    double waited = 0.0;
    for (long spins = 1; __atomic_load_n(&s->passed, __ATOMIC_ACQUIRE) == passed; ++spins) {
        if (spins % 64 == 0) waited = now_ns() - start;
        if (waited < SPIN_NS) {
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
        } else if (waited < YIELD_NS) {
            sched_yield();
        } else {  /* a thread long off its core: wait without holding this one */
            nanosleep(&(struct timespec){.tv_nsec = 50000}, NULL);
            waited = now_ns() - start;
        }
    }
}

/* h (n, hidden) += x W^T, W (hidden, in) a weight's table (quant.c): each chunk's outputs added
 * by the thread that made them. With `norm` (a norm after the branch) the product's rows are
 * whole first: then each row is normed and added by one thread, counters[1] handing them out.
 * buf: this thread's row of dequantized weights. */
static void add_product(step_t *s, int nth, const int64_t *w, const float *x, int64_t in, int64_t *counters,
                        const float *norm, float *buf) {
    const int64_t n = s->dims[D_N], hidden = s->dims[D_HIDDEN];
    float *h = s->ptrs[P_H];
    CHUNKS(&counters[0], hidden, chunk_rows(w), nth, o0, o1) {
        weight_range(w, x, s->y, n, in, o0, o1, buf);
        if (!norm)
            for (int64_t r = 0; r < n; ++r)
                for (int64_t o = o0; o < o1; ++o) h[r * hidden + o] = h[r * hidden + o] + s->y[r * hidden + o];
    }
    if (!norm) return;
    barrier(s, nth);
    CHUNKS(&counters[1], n, 1, nth, r0, r1) {
        token_lab_rms_norm(s->y + r0 * hidden, norm, s->y + r0 * hidden, r1 - r0, hidden, s->eps);
        for (int64_t i = r0 * hidden; i < r1 * hidden; ++i) h[i] = h[i] + s->y[i];
    }
}

static void decode_body(step_t *s, int nth) {
    const int64_t *dm = s->dims;
    const int64_t n = dm[D_N], hidden = dm[D_HIDDEN], heads = dm[D_HEADS], kv_heads = dm[D_KV_HEADS],
                  d = dm[D_HEAD_DIM], ffn = dm[D_FFN], vocab = dm[D_VOCAB], n_layers = dm[D_LAYERS];
    const int64_t units = heads + 2 * kv_heads, width = units * d, kv_width = kv_heads * d;
    float *h = s->ptrs[P_H];
    const int64_t *slots = s->ptrs[P_SLOTS], *blocks = s->ptrs[P_BLOCKS], *lengths = s->ptrs[P_LENGTHS];
    float *x = malloc(sizeof(float) * n * hidden);  /* this thread's normed rows */
    float *p = malloc(sizeof(float) * (dm[D_MAX_L] > 0 ? dm[D_MAX_L] : 1));  /* attention's scores */
    const int64_t widest = hidden > ffn ? (hidden > heads * d ? hidden : heads * d) : (ffn > heads * d ? ffn : heads * d);
    float *buf = malloc(sizeof(float) * widest);  /* a row of dequantized weights */
    if (!x || !p || !buf) abort();
    int64_t stage = 0;
    for (int64_t l = 0; l < n_layers; ++l) {
        const int64_t *t = s->layers + l * L_FIELDS;
        const int64_t *wqkv = (const int64_t *)(intptr_t)t[L_WQKV];
        const float *bqkv = (const float *)(intptr_t)t[L_BQKV];
        float *k_pool = (float *)(intptr_t)t[L_K_POOL], *v_pool = (float *)(intptr_t)t[L_V_POOL];
        const float *q_norm = (const float *)(intptr_t)t[L_Q_NORM], *k_norm = (const float *)(intptr_t)t[L_K_NORM];
        const int local = (int)t[L_SLIDING];
        const float *cos = s->ptrs[local ? P_COS_LOCAL : P_COS], *sin = s->ptrs[local ? P_SIN_LOCAL : P_SIN];
        const int64_t *first = s->ptrs[local ? P_FIRST_LOCAL : P_FIRST];

        /* ---- q, k, v: heads claimed in turn, each rotated and stored by the thread that made it */
        token_lab_rms_norm(h, (const float *)(intptr_t)t[L_ATTN_NORM], x, n, hidden, s->eps);
        CHUNKS(&s->counters[stage], units, 1, nth, u0, u1) {
            weight_range(wqkv, x, s->qkv, n, hidden, u0 * d, u1 * d, buf);
            for (int64_t r = 0; r < n; ++r)
                for (int64_t u = u0; u < u1; ++u) {
                    float *row = s->qkv + r * width + u * d;
                    if (bqkv)
                        for (int64_t i = 0; i < d; ++i) row[i] = row[i] + bqkv[u * d + i];
                    if (q_norm && u < heads + kv_heads)
                        token_lab_rms_norm(row, u < heads ? q_norm : k_norm, row, 1, d, s->eps);
                    const float *c = cos + r * d, *sn = sin + r * d;
                    if (u < heads) rotate(row, c, sn, s->q + (r * heads + u) * d, d);
                    else if (u < heads + kv_heads) rotate(row, c, sn, k_pool + slots[r] * kv_width + (u - heads) * d, d);
                    else memcpy(v_pool + slots[r] * kv_width + (u - heads - kv_heads) * d, row, sizeof(float) * d);
                }
        }
        ++stage;
        barrier(s, nth);

        /* ---- attention: (row, head) pairs claimed in turn */
        const int64_t offset = dm[D_CTX_OFFSET] * kv_width;
        CHUNKS(&s->counters[stage], n * heads, 1, nth, rh0, rh1) for (int64_t rh = rh0; rh < rh1; ++rh) {
            const int64_t r = rh / heads, g = rh % heads / (heads / kv_heads);
            attend_head(s->q + rh * d, k_pool + offset + g * d, v_pool + offset + g * d, s->att + rh * d, p,
                        blocks ? blocks + r * dm[D_N_BLOCKS] : NULL, dm[D_BLOCK_SIZE], first[r], lengths[r],
                        kv_width, kv_width, d, s->scale);
        }
        ++stage;
        barrier(s, nth);

        /* ---- h += [RMSNorm](att Wo^T) */
        add_product(s, nth, (const int64_t *)(intptr_t)t[L_WO], s->att, heads * d, &s->counters[stage],
                    (const float *)(intptr_t)t[L_POST_ATTN_NORM], buf);
        stage += 2;
        barrier(s, nth);

        /* ---- g = act(gate) * up: gate row i and up row i by the same thread */
        token_lab_rms_norm(h, (const float *)(intptr_t)t[L_FFN_NORM], x, n, hidden, s->eps);
        const int gelu = (int)dm[D_GELU];
        const int64_t *w13 = (const int64_t *)(intptr_t)t[L_W13];
        CHUNKS(&s->counters[stage], ffn, chunk_rows(w13) / 2, nth, i0, i1) {
            weight_range(w13, x, s->gu, n, hidden, i0, i1, buf);
            weight_range(w13, x, s->gu, n, hidden, ffn + i0, ffn + i1, buf);
            for (int64_t r = 0; r < n; ++r) {
                const float *gate = s->gu + r * 2 * ffn, *up = gate + ffn;
                for (int64_t i = i0; i < i1; ++i) s->g[r * ffn + i] = act(gate[i], gelu) * up[i];
            }
        }
        ++stage;
        barrier(s, nth);

        /* ---- h += [RMSNorm](g Wdown^T) */
        add_product(s, nth, (const int64_t *)(intptr_t)t[L_W2], s->g, ffn, &s->counters[stage],
                    (const float *)(intptr_t)t[L_POST_FFN_NORM], buf);
        stage += 2;
        barrier(s, nth);
    }

    /* ---- logits = RMSNorm(h) Whead^T */
    token_lab_rms_norm(h, s->ptrs[P_NORM], x, n, hidden, s->eps);
    CHUNKS(&s->counters[stage], vocab, chunk_rows(s->ptrs[P_HEAD]), nth, o0, o1) {
        weight_range(s->ptrs[P_HEAD], x, s->ptrs[P_LOGITS], n, hidden, o0, o1, buf);
    }
    free(x);
    free(p);
    free(buf);
}

static costs_t step_costs[17];

/* dims, layers (n_layers, L_FIELDS), ptrs: as the enums above name them; the k/v pools are
 * contiguous float32, the products' weights (L_WQKV, L_WO, L_W13, L_W2, P_HEAD) weight tables
 * (quant.c: float32 or the file's blocks), h (n, hidden) is updated in place, logits (n, vocab) written.
 * bytes: what the step reads (for its cost). */
void token_lab_decode(const int64_t *dims, const int64_t *layers, void *const *ptrs, float eps, float scale,
                      int64_t bytes, int threads) {
    const int64_t n = dims[D_N], hidden = dims[D_HIDDEN], heads = dims[D_HEADS], d = dims[D_HEAD_DIM],
                  ffn = dims[D_FFN], width = (heads + 2 * dims[D_KV_HEADS]) * d;
    step_t s = {.dims = dims, .layers = layers, .ptrs = ptrs, .eps = eps, .scale = scale};
    float *scratch = malloc(sizeof(float) * n * (width + 2 * heads * d + hidden + 3 * ffn));
    s.counters = calloc(dims[D_LAYERS] * 7 + 1, sizeof(int64_t));  /* a layer's stages, two for each product added */
    if (!scratch || !s.counters) abort();
    s.qkv = scratch;
    s.q = s.qkv + n * width;
    s.att = s.q + n * heads * d;
    s.y = s.att + n * heads * d;
    s.gu = s.y + n * hidden;
    s.g = s.gu + n * 2 * ffn;
    costs_t *costs = &step_costs[n < 16 ? n : 16];
    const int pick = threads > 1 && !forked ? pick_threads(costs) : 0;
    const double t = now_ns();
    if (pick) {
        #pragma omp parallel num_threads(threads)
        decode_body(&s, omp_get_num_threads());
    } else {
        decode_body(&s, 1);
    }
    if (threads > 1 && !forked) record_cost(costs, pick, t, bytes);
    free(scratch);
    free(s.counters);
}
