/* Kernels for a decode step on a CPU, float32 (loaded by __init__.py; design: docs/design.md).
 *
 * A decode step reads every weight once, so its products are bound by memory bandwidth: these
 * read each (out, in) row-major weight as one stream per thread (token_lab_gemm_rows). Each
 * output is the float32 sum of its row's products in dot()'s order, with fused multiply-adds
 * throughout: one order and one rounding of arithmetic for every kernel that sums a row.
 *
 * Vector width: GCC's vector extension, lowered to what the CPU has. Threads: see split(). */
#include <math.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
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
typedef float v16 __attribute__((vector_size(64)));

static inline v8 load8(const float *p) { v8 v; memcpy(&v, p, sizeof v); return v; }
static inline v16 load16(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }
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

#include "tiles.c"

/* y = W x for one row of activations: a decode step of one run. */
void token_lab_gemv(const float *w, const float *x, float *y, int64_t out, int64_t in,
                    int64_t stride, int threads) {
    token_lab_gemm_rows(w, x, y, 1, out, in, stride, in, threads);
}

#include "attention.c"

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
 * Rows of a fused q/k/v projection, qkv (n, (heads + 2 kv_heads) * d): the first rd dims of each
 * q and k head rotated by its row's tables, cos and signed_sin (n, rd) ("rotate half": dimension
 * i pairs with i + rd/2, x * cos + roll(x, rd/2) * signed_sin), the rest (partial rotary, rd < d)
 * copied; q into q_out (n, heads, d), k and v into the pool's slot for the row (k_pool, v_pool:
 * (slots, kv_heads, d)). Seven operators of torch's for a decode row, in one pass. */
static inline void rotate(const float *x, const float *c, const float *s, float *out, int64_t d, int64_t rd) {
    const int64_t half = rd / 2;  /* x[(i + half) % rd], in two runs that GCC vectorizes */
    for (int64_t i = 0; i < half; ++i) out[i] = x[i] * c[i] + x[i + half] * s[i];
    for (int64_t i = half; i < rd; ++i) out[i] = x[i] * c[i] + x[i - half] * s[i];
    for (int64_t i = rd; i < d; ++i) out[i] = x[i];
}

void token_lab_rope_store(const float *qkv, const float *cos, const float *signed_sin, float *q_out,
                          float *k_pool, float *v_pool, const int64_t *slots, int64_t n,
                          int64_t heads, int64_t kv_heads, int64_t d, int64_t rd) {
    const int64_t width = (heads + 2 * kv_heads) * d;
    for (int64_t r = 0; r < n; ++r) {
        const float *row = qkv + r * width, *c = cos + r * rd, *s = signed_sin + r * rd;
        for (int64_t h = 0; h < heads; ++h) rotate(row + h * d, c, s, q_out + (r * heads + h) * d, d, rd);
        float *k = k_pool + slots[r] * kv_heads * d, *v = v_pool + slots[r] * kv_heads * d;
        for (int64_t g = 0; g < kv_heads; ++g) rotate(row + (heads + g) * d, c, s, k + g * d, d, rd);
        memcpy(v, row + (heads + kv_heads) * d, sizeof(float) * kv_heads * d);
    }
}

/* ---------------------------------------------------------------- gated activation
 * x (n, 2f) = [gate | up] -> y (n, f) = act(gate) * up: SiLU a sigmoid(a) (gelu 0) or
 * tanh-approximated GELU (gelu 1, Gemma's GeGLU), 0.5 a (1 + tanh z) = a sigmoid(2z) with
 * z = sqrt(2/pi) (a + 0.044715 a^3). sigmoid(s) = 1 / (1 + e^-s), or e^s / (1 + e^s) below 0:
 * through e^-|s| (exp16's range, and 1 + tanh z is never a difference of near-equal numbers).
 * Sixteen lanes at a time, each lane the same operations (libm's expf and tanhf one value at a
 * time: SmolLM2's 128 x 1536 took 596-684 us, Gemma's GELU on it 2261-2364; now 75-96 and
 * 103-115; torch's SiLU 79-126): an element's bits do not depend on where its sixteen begin (a
 * prompt's rows and the decode step's threads' spans cut them differently). */
static inline v16 act16(v16 a, int gelu) {
    const v16 s = gelu ? 2.0f * (0.7978845608028654f * (a + 0.044715f * a * a * a)) : a;
    const v16i sign = (v16i){0} + INT32_MIN;  /* each lane 0x80000000 */
    v16i bits;  /* (whole-vector bit operations: GCC made lane-by-lane loops scalar, 10x slower) */
    memcpy(&bits, &s, sizeof s);
    bits |= sign;  /* -|s| */
    const v16 one = (v16){0} + 1.0f;
    v16 t;
    memcpy(&t, &bits, sizeof t);
    const v16 e = exp16(t);
    const v16i below = s < 0.0f;  /* all ones where s < 0: a e there, a elsewhere (a 1 = a) */
    v16i eb, ob;
    memcpy(&eb, &e, sizeof e);
    memcpy(&ob, &one, sizeof one);
    eb = (eb & below) | (ob & ~below);
    memcpy(&t, &eb, sizeof t);
    return a * t / (1.0f + e);
}

/* o[i] = act(g[i]) * u[i] for i < n, sixteen at a time (the last sixteen padded). */
static inline void act_span(const float *g, const float *u, float *o, int64_t n, int gelu) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const v16 y = act16(load16(g + i), gelu) * load16(u + i);
        memcpy(o + i, &y, sizeof y);
    }
    if (i < n) {
        v16 gv = {0}, uv = {0};
        memcpy(&gv, g + i, sizeof(float) * (n - i));
        memcpy(&uv, u + i, sizeof(float) * (n - i));
        const v16 y = act16(gv, gelu) * uv;
        memcpy(o + i, &y, sizeof(float) * (n - i));
    }
}

typedef struct { const float *x; float *y; int64_t f; int gelu; } glu_t;

static void glu_range(void *ctx, int64_t begin, int64_t end) {
    const glu_t *a = ctx;
    for (int64_t r = begin; r < end; ++r) {
        const float *g = a->x + r * 2 * a->f, *u = g + a->f;
        float *o = a->y + r * a->f;
        act_span(g, u, o, a->f, a->gelu);
    }
}

static costs_t glu_costs[48];

/* A prompt's rows split between the threads (each row's numbers the same on any of them). */
void token_lab_glu(const float *x, float *y, int64_t n, int64_t f, int gelu, int threads) {
    glu_t a = {x, y, f, gelu};
    const int64_t bytes = n * 3 * f * (int64_t)sizeof(float);
    split(glu_range, &a, n, bytes, threads, by_size(glu_costs, bytes));
}

#include "stats.c"
#include "quant.c"
#include "quant_simd.c"
#include "ipack.c"
#include "islices.c"
#include "products.c"
#include "step.c"
