/* Many rows of float32 products (a prompt's), included by kernels.c after dot() and its vector
 * helpers.
 *
 * ---------------------------------------------------------------- many rows, each as dot()
 * Y = X W^T for any number of rows of X (a prompt's), each output the same sum in dot()'s order
 * as token_lab_gemm_rows gives it, so a row's numbers do not depend on the rows beside it.
 * dot()'s four 8-lane accumulators are two 16-lane registers per output (lanes 0-7 and 8-15
 * holding a and b, then c and d): "ab" takes each chunk of 32's first 16 inputs, "cd" its last.
 * Tiles of four weight rows by three rows of X: 24 accumulators, and each half-chunk's three X
 * loads serve four weight rows and each weight load three X rows (7 loads for 12 FMAs; a 4x2
 * tile needed 6 for 8, and a core loads one 64-byte vector a cycle as it does one FMA). The X
 * rows go in blocks that stay in the core's L2 cache while every weight tile passes over them. */
#ifdef __AVX512F__  /* without it (16 vector registers) token_lab_gemm_tiles uses the rows kernel */
/* dot()'s ending from its accumulators ab (a | b) and cd (c | d) at input i: the chunks of 8
 * into a, (a + b) + (c + d) across lanes, then the tail. */
static inline float dot_end(v16 ab, v16 cd, const float *r, const float *x, int64_t i, int64_t n) {
    v8 a, b, c, d;
    memcpy(&a, &ab, 32); memcpy(&b, (const char *)&ab + 32, 32);
    memcpy(&c, &cd, 32); memcpy(&d, (const char *)&cd + 32, 32);
    for (; i + 8 <= n; i += 8) a = fma8(load8(r + i), load8(x + i), a);
    float s = sum8((a + b) + (c + d));
    for (; i < n; ++i) s = fmaf(r[i], x[i], s);
    return s;
}

typedef struct { const float *w, *x; float *y; int64_t rows, out, in, stride, x_stride; } tiles_t;

enum { TILE_W = 4, TILE_X = 3, X_BLOCK_BYTES = 512 * 1024 };

/* One tile: weight rows w[0..3] by X rows x[0..2], into acc[k][j][0] (ab) and [1] (cd). */
static inline void tile(const float *const w[TILE_W], const float *const x[TILE_X], int64_t full,
                        const float *next, int64_t stride, v16 acc[TILE_W][TILE_X][2]) {
    v16 s00 = {0}, s01 = {0}, s02 = {0}, s10 = {0}, s11 = {0}, s12 = {0};
    v16 s20 = {0}, s21 = {0}, s22 = {0}, s30 = {0}, s31 = {0}, s32 = {0};
    v16 t00 = {0}, t01 = {0}, t02 = {0}, t10 = {0}, t11 = {0}, t12 = {0};
    v16 t20 = {0}, t21 = {0}, t22 = {0}, t30 = {0}, t31 = {0}, t32 = {0};
    const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3], *x0 = x[0], *x1 = x[1], *x2 = x[2];
    /* GCC folded these loads into the FMAs as memory operands, loading each vector three or four
     * times (23 loads for 16 FMAs): an empty asm that "changes" each loaded vector keeps it in a
     * register. The intrinsic is one single-rounding FMA, as fma8's lanes are (the same bits). */
#define FMA16(v, x, s) s = (v16)_mm512_fmadd_ps((__m512)(v), (__m512)(x), (__m512)(s))
#define IN_REGISTER(v) __asm__("" : "+v"(v))
    for (int64_t i = 0; i < full; i += 32) {
        if (next)  /* the next weight tile's rows (from DRAM), as this tile's first X rows use these */
            for (int k = 0; k < TILE_W; ++k) {
                __builtin_prefetch(next + k * stride + i);
                __builtin_prefetch(next + k * stride + i + 16);
            }
        v16 a = load16(x0 + i), b = load16(x1 + i), c = load16(x2 + i), v;
        IN_REGISTER(a); IN_REGISTER(b); IN_REGISTER(c);
        v = load16(w0 + i); IN_REGISTER(v); FMA16(v, a, s00); FMA16(v, b, s01); FMA16(v, c, s02);
        v = load16(w1 + i); IN_REGISTER(v); FMA16(v, a, s10); FMA16(v, b, s11); FMA16(v, c, s12);
        v = load16(w2 + i); IN_REGISTER(v); FMA16(v, a, s20); FMA16(v, b, s21); FMA16(v, c, s22);
        v = load16(w3 + i); IN_REGISTER(v); FMA16(v, a, s30); FMA16(v, b, s31); FMA16(v, c, s32);
        a = load16(x0 + i + 16); b = load16(x1 + i + 16); c = load16(x2 + i + 16);
        IN_REGISTER(a); IN_REGISTER(b); IN_REGISTER(c);
        v = load16(w0 + i + 16); IN_REGISTER(v); FMA16(v, a, t00); FMA16(v, b, t01); FMA16(v, c, t02);
        v = load16(w1 + i + 16); IN_REGISTER(v); FMA16(v, a, t10); FMA16(v, b, t11); FMA16(v, c, t12);
        v = load16(w2 + i + 16); IN_REGISTER(v); FMA16(v, a, t20); FMA16(v, b, t21); FMA16(v, c, t22);
        v = load16(w3 + i + 16); IN_REGISTER(v); FMA16(v, a, t30); FMA16(v, b, t31); FMA16(v, c, t32);
    }
#undef FMA16
#undef IN_REGISTER
    const v16 s[TILE_W][TILE_X] = {{s00, s01, s02}, {s10, s11, s12}, {s20, s21, s22}, {s30, s31, s32}};
    const v16 t[TILE_W][TILE_X] = {{t00, t01, t02}, {t10, t11, t12}, {t20, t21, t22}, {t30, t31, t32}};
    for (int k = 0; k < TILE_W; ++k)
        for (int j = 0; j < TILE_X; ++j) { acc[k][j][0] = s[k][j]; acc[k][j][1] = t[k][j]; }
}

/* dot()'s ending for eight outputs of a tile, o0 .. o0 + 7 of its TILE_W x TILE_X (past the
 * last, the last again), with no chunks of 8 nor tail left: each output's (a + b) + (c + d),
 * then its eight lanes added in order from 0, as sum8 does, but eight outputs a lane each: the
 * eight vectors transposed, then seven additions of whole vectors. */
static inline void sums8x8(const v16 acc[TILE_W][TILE_X][2], int o0, float out[8]) {
    v8 g[8];
    for (int o = 0; o < 8; ++o) {
        const int at = o0 + o < TILE_W * TILE_X ? o0 + o : TILE_W * TILE_X - 1;
        const v16 ab = acc[at / TILE_X][at % TILE_X][0], cd = acc[at / TILE_X][at % TILE_X][1];
        const v8 av = __builtin_shufflevector(ab, ab, 0, 1, 2, 3, 4, 5, 6, 7);
        const v8 bv = __builtin_shufflevector(ab, ab, 8, 9, 10, 11, 12, 13, 14, 15);
        const v8 cv = __builtin_shufflevector(cd, cd, 0, 1, 2, 3, 4, 5, 6, 7);
        const v8 dv = __builtin_shufflevector(cd, cd, 8, 9, 10, 11, 12, 13, 14, 15);
        g[o] = (av + bv) + (cv + dv);
    }
    v8 t[8], u[8];
    for (int r = 0; r < 4; ++r) {  /* t[2r]: g[2r], g[2r+1]'s lanes 0, 1, 4, 5 interleaved; t[2r+1]: 2, 3, 6, 7 */
        t[2 * r] = __builtin_shufflevector(g[2 * r], g[2 * r + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[2 * r + 1] = __builtin_shufflevector(g[2 * r], g[2 * r + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int h = 0; h < 2; ++h) {  /* u[4h + m]: outputs 4h .. 4h+3's lanes m and m + 4 */
        const v8 *p = t + 4 * h;
        u[4 * h] = __builtin_shufflevector(p[0], p[2], 0, 1, 8, 9, 4, 5, 12, 13);
        u[4 * h + 1] = __builtin_shufflevector(p[0], p[2], 2, 3, 10, 11, 6, 7, 14, 15);
        u[4 * h + 2] = __builtin_shufflevector(p[1], p[3], 0, 1, 8, 9, 4, 5, 12, 13);
        u[4 * h + 3] = __builtin_shufflevector(p[1], p[3], 2, 3, 10, 11, 6, 7, 14, 15);
    }
    v8 s = {0};  /* lane o: output o's lanes 0 .. 7 added in order */
    for (int m = 0; m < 4; ++m) s += __builtin_shufflevector(u[m], u[4 + m], 0, 1, 2, 3, 8, 9, 10, 11);
    for (int m = 0; m < 4; ++m) s += __builtin_shufflevector(u[m], u[4 + m], 4, 5, 6, 7, 12, 13, 14, 15);
    memcpy(out, &s, sizeof s);
}

static void tiles_range(void *ctx, int64_t begin, int64_t end) {
    const tiles_t *a = ctx;
    const int64_t n = a->in, full = n / 32 * 32;
    /* blocks of at most X_BLOCK_BYTES, of even size (a multiple of TILE_X): no short block at the end */
    int64_t most = X_BLOCK_BYTES / (n * (int64_t)sizeof(float));
    most = most < TILE_X ? TILE_X : most;
    const int64_t blocks = (a->rows + most - 1) / most;
    const int64_t block = ((a->rows + blocks - 1) / blocks + TILE_X - 1) / TILE_X * TILE_X;
    for (int64_t rb = 0; rb < a->rows; rb += block) {
        const int64_t rend = rb + block < a->rows ? rb + block : a->rows;
        for (int64_t o0 = TILE_W * begin; o0 < TILE_W * end && o0 < a->out; o0 += TILE_W) {
            const int nw = a->out - o0 < TILE_W ? (int)(a->out - o0) : TILE_W;
            const float *w[TILE_W];
            for (int k = 0; k < TILE_W; ++k) w[k] = a->w + (o0 + (k < nw ? k : 0)) * a->stride;
            for (int64_t r0 = rb; r0 < rend; r0 += TILE_X) {
                const int nx = rend - r0 < TILE_X ? (int)(rend - r0) : TILE_X;
                const float *x[TILE_X];
                for (int j = 0; j < TILE_X; ++j) x[j] = a->x + (r0 + (j < nx ? j : 0)) * a->x_stride;
                v16 acc[TILE_W][TILE_X][2];
                const int last = o0 + 2 * TILE_W > a->out || o0 + TILE_W >= TILE_W * end;
                tile(w, x, full, r0 == rb && !last ? a->w + (o0 + TILE_W) * a->stride : NULL, a->stride, acc);
                if (full == n) {  /* no chunks of 8 nor tail: eight outputs' endings at once */
                    float s[2 * 8];
                    sums8x8(acc, 0, s);
                    sums8x8(acc, 8, s + 8);
                    for (int k = 0; k < nw; ++k)
                        for (int j = 0; j < nx; ++j) a->y[(r0 + j) * a->out + o0 + k] = s[k * TILE_X + j];
                    continue;
                }
                for (int k = 0; k < nw; ++k)
                    for (int j = 0; j < nx; ++j)
                        a->y[(r0 + j) * a->out + o0 + k] = dot_end(acc[k][j][0], acc[k][j][1], w[k], x[j], full, n);
            }
        }
    }
}

static costs_t tiles_costs[48];
#endif

/* Y (rows, out) = X W^T, W (out, in) row-major rows `stride` floats apart, X rows x_stride apart. */
void token_lab_gemm_tiles(const float *w, const float *x, float *y, int64_t rows, int64_t out,
                          int64_t in, int64_t stride, int64_t x_stride, int threads) {
#ifdef __AVX512F__
    tiles_t a = {w, x, y, rows, out, in, stride, x_stride};
    const int64_t work = out * in * rows * (int64_t)sizeof(float);
    split(tiles_range, &a, (out + TILE_W - 1) / TILE_W, work, threads, by_size(tiles_costs, work));
#else
    /* With 16 vector registers (AVX2) the tile's 24 16-lane accumulators spilled to the stack: it
     * ran at 16 GFLOP/s against the rows kernel's 88-96 (each weight row read once for two rows
     * of X), which gives the same bits. */
    token_lab_gemm_rows(w, x, y, rows, out, in, stride, x_stride, threads);
#endif
}
