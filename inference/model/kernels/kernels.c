/* Kernels for a decode step on a CPU, float32 (loaded by __init__.py). */

/* ---------------------------------------------------------------- matrix-vector product
 * y = W x for one row of activations: a decode step's matrix-vector products.
 *
 * A decode step reads every weight once, so its products are bound by memory bandwidth. MKL's
 * sgemv reaches 13-23 GB/s on SmolLM2's shapes on a 2-core machine whose read bandwidth is
 * ~28 GB/s; this reads each (out, in) row-major weight as one stream per thread and reaches
 * 26-34 GB/s (bench/measured/). Each output is the float32 sum of its row's products in 8
 * lanes then added up, the tail after, with fused multiply-adds throughout: one order and one
 * rounding of arithmetic for every kernel that sums a row.
 *
 * Threads: OpenMP, from the runtime torch already loaded (libgomp.so.1), so torch's ops and
 * these share one pool. Vector width: GCC's vector extension, lowered to what the CPU has. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* One output: the dot product of row r (length n) with x. */
static inline float dot(const float *r, const float *x, int64_t n) {
    v8 a = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) a = fma8(load8(r + i), load8(x + i), a);
    float s = sum8(a);
    for (; i < n; ++i) s = fmaf(r[i], x[i], s);
    return s;
}

/* w: (out, in) with rows `stride` floats apart; x: (in,); y: (out,). Four rows at a time share
 * each load of x; the rows are split evenly between `threads` threads. */
void token_lab_gemv(const float *w, const float *x, float *y, int64_t out, int64_t in,
                    int64_t stride, int threads) {
    const int64_t quads = out / 4;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t q = 0; q < quads; ++q) {
        const int64_t o = 4 * q;
        const float *r0 = w + o * stride, *r1 = r0 + stride, *r2 = r1 + stride, *r3 = r2 + stride;
        v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        int64_t i = 0;
        for (; i + 8 <= in; i += 8) {
            const v8 xv = load8(x + i);
            a0 = fma8(load8(r0 + i), xv, a0);
            a1 = fma8(load8(r1 + i), xv, a1);
            a2 = fma8(load8(r2 + i), xv, a2);
            a3 = fma8(load8(r3 + i), xv, a3);
        }
        float s0 = sum8(a0), s1 = sum8(a1), s2 = sum8(a2), s3 = sum8(a3);
        for (; i < in; ++i) {
            s0 = fmaf(r0[i], x[i], s0); s1 = fmaf(r1[i], x[i], s1);
            s2 = fmaf(r2[i], x[i], s2); s3 = fmaf(r3[i], x[i], s3);
        }
        y[o] = s0; y[o + 1] = s1; y[o + 2] = s2; y[o + 3] = s3;
    }
    for (int64_t o = 4 * quads; o < out; ++o) y[o] = dot(w + o * stride, x, in);
}

/* Y = X W^T for a few rows of activations (a decode step of several runs): X (rows, in) with
 * rows x_stride floats apart, Y (rows, out). Two weight rows at a time are read from memory
 * once for up to four rows of X (each load of X serves both), and every output is summed
 * exactly as token_lab_gemv sums it (one 8-lane accumulator, then the tail): a run's numbers
 * are the same bits whoever else is in the step. */
static inline void rows_block(const float *w0, const float *w1, const float *x, int64_t x_stride,
                              float *y, int64_t y_stride, int64_t in, int pair, int n) {
    v8 a[4] = {{0}}, b[4] = {{0}};
    int64_t i = 0;
    for (; i + 8 <= in; i += 8) {
        const v8 v0 = load8(w0 + i), v1 = pair ? load8(w1 + i) : v0;
        for (int r = 0; r < n; ++r) {
            const v8 xv = load8(x + r * x_stride + i);
            a[r] = fma8(v0, xv, a[r]);
            if (pair) b[r] = fma8(v1, xv, b[r]);
        }
    }
    for (int r = 0; r < n; ++r) {
        const float *xr = x + r * x_stride;
        float s = sum8(a[r]), t = sum8(b[r]);
        for (int64_t k = i; k < in; ++k) {
            s = fmaf(w0[k], xr[k], s);
            if (pair) t = fmaf(w1[k], xr[k], t);
        }
        y[r * y_stride] = s;
        if (pair) y[r * y_stride + 1] = t;
    }
}

void token_lab_gemm_rows(const float *w, const float *x, float *y, int64_t rows, int64_t out,
                         int64_t in, int64_t stride, int64_t x_stride, int threads) {
    const int64_t pairs = (out + 1) / 2;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < pairs; ++p) {
        const int64_t o = 2 * p;
        const int pair = o + 1 < out;
        const float *w0 = w + o * stride, *w1 = w0 + (pair ? stride : 0);
        int64_t r = 0;
        for (; r + 4 <= rows; r += 4) rows_block(w0, w1, x + r * x_stride, x_stride, y + r * out + o, out, in, pair, 4);
        for (; r < rows; ++r) rows_block(w0, w1, x + r * x_stride, x_stride, y + r * out + o, out, in, pair, 1);
    }
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
void token_lab_attend(const float *q, const float *k, const float *v, float *out, int64_t rows,
                      const int64_t *blocks, int64_t n_blocks, int64_t block_size,
                      const int64_t *first, const int64_t *L, int64_t max_L,
                      int64_t k_pos, int64_t k_head, int64_t v_pos, int64_t v_head,
                      int64_t heads, int64_t kv_heads, int64_t d, float scale, int threads) {
    const int64_t rep = heads / kv_heads;
    #pragma omp parallel num_threads(threads)
    {
        float *p = malloc(sizeof(float) * (max_L > 0 ? max_L : 1));
        #pragma omp for schedule(static)
        for (int64_t rh = 0; rh < rows * heads; ++rh) {
            const int64_t r = rh / heads, h = rh % heads, g = h / rep;
            attend_head(q + rh * d, k + g * k_head, v + g * v_head, out + rh * d, p,
                        blocks ? blocks + r * n_blocks : NULL, block_size, first[r], L[r],
                        k_pos, v_pos, d, scale);
        }
        free(p);
    }
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
void token_lab_glu(const float *x, float *y, int64_t n, int64_t f, int gelu) {
    for (int64_t r = 0; r < n; ++r) {
        const float *g = x + r * 2 * f, *u = g + f;
        float *o = y + r * f;
        for (int64_t i = 0; i < f; ++i) {
            const float a = g[i];
            const float act = gelu ? 0.5f * a * (1.0f + tanhf(0.7978845608028654f * (a + 0.044715f * a * a * a)))
                                   : a / (1.0f + expf(-a));
            o[i] = act * u[i];
        }
    }
}
