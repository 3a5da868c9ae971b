/* exp sixteen lanes at a time, and attention over a paged cache: one query's scores, softmax and
 * weighted values, each in one fixed order (included by kernels.c, after its vector helpers). */

/* ---------------------------------------------------------------- exp, 16 at a time
 * exp(x) for x <= 0 in float32, 16 lanes at a time (GCC's vectors: AVX-512 where the CPU has it),
 * each lane the same operations (so the same bits on any vector width): x = n ln2 + r with
 * |r| <= ln2 / 2, e^r by Cephes' degree-6 polynomial (within 2 ulp), times 2^n. Below -87.3 (a
 * float32 subnormal or 0: at most 1e-38 of the sum, which holds 1 for the largest) it is 0. */
typedef int32_t v16i __attribute__((vector_size(64)));
static inline v16 exp16(v16 x) {
    v16 n, r, p, y;
    for (int l = 0; l < 16; ++l) n[l] = nearbyintf(x[l] * 1.44269504088896341f);
    for (int l = 0; l < 16; ++l) r[l] = fmaf(n[l], -0.693359375f, x[l]);
    for (int l = 0; l < 16; ++l) r[l] = fmaf(n[l], 2.12194440e-4f, r[l]);
    for (int l = 0; l < 16; ++l) {
        p[l] = fmaf(1.9875691500e-4f, r[l], 1.3981999507e-3f);
        p[l] = fmaf(p[l], r[l], 8.3334519073e-3f);
        p[l] = fmaf(p[l], r[l], 4.1665795894e-2f);
        p[l] = fmaf(p[l], r[l], 1.6666665459e-1f);
        p[l] = fmaf(p[l], r[l], 5.0000001201e-1f);
        y[l] = fmaf(p[l] * r[l], r[l], r[l]) + 1.0f;
    }
    v16i bits = (__builtin_convertvector(n, v16i) + 127) << 23;
    v16 scale;
    memcpy(&scale, &bits, sizeof scale);
    y *= scale;
    const v16i keep = ~(x < -87.3f);  /* all ones where x >= -87.3 */
    v16i ybits;
    memcpy(&ybits, &y, sizeof y);
    ybits &= keep;
    memcpy(&y, &ybits, sizeof y);
    return y;
}
/* Key j's slot: through a block table of blocks block_size (a power of two: the pool's 16, or 1
 * for a table of slots) apart, or j itself (NULL: read in place). No division: a shift and a mask. */
static inline int64_t key_slot(const int64_t *blocks, int64_t block_size, int64_t j) {
    if (!blocks) return j;
    const int shift = __builtin_ctzll((unsigned long long)block_size);
    return (blocks[j >> shift] << shift) + (j & (block_size - 1));
}

/* Ask for key j's n floats at key_slot(j) * pos + base into L2, KEYS_AHEAD keys before they are
 * read. A head's key is a third of its slot (SmolLM2: 256 of 768 bytes), eight keys' reads
 * span 6 KiB, and each pass reads one head's keys alone: the hardware's prefetchers fetched too
 * little of that pattern, and attention from memory ran at 7-13 GB/s (the cache's own speed
 * 2.5-3.5x that). Asked 32 keys ahead into L2, 8 decode rows over 448 keys attended 1.5-1.7x as
 * fast, one row over 832 keys 1.5-1.9x; asked into L1 or non-temporally, it gained nothing. Keys
 * past L are not asked for (nor their block-table entries read). bench/measured/cpu-integer-products.md */
enum { KEYS_AHEAD = 32 };
static inline void ask_key(const float *base, const int64_t *blocks, int64_t block_size, int64_t j, int64_t L,
                           int64_t pos, int64_t n) {
    if (j >= L) return;
    const char *at = (const char *)(base + key_slot(blocks, block_size, j) * pos);
    for (int64_t c = 0; c < n * (int64_t)sizeof(float); c += 64) __builtin_prefetch(at + c, 0, 2);
}

/* ---------------------------------------------------------------- attention, one query
 * Attention of one query per head over its keys, float32: a decode row.
 *
 * Key j of kv head g lies at k + row(j) * k_pos + g * k_head (likewise v), where row(j) = j for
 * keys read in place, or, through a block table, blocks[j / block_size] * block_size + j %
 * block_size (the paged pool's slots). Keys `first` .. L-1 are visible (a sliding window starts
 * past 0). Query head h reads kv head h / (heads / kv_heads) (grouped-query attention); with cap > 0
 * each score is soft-capped, cap tanh(score / cap) (Gemma 2). Scores,
 * softmax and the weighted sum in float32 like SDPA's CPU kernel, in one order whatever the
 * layout, so a row's output is the same bits read in place or through blocks. SDPA's dispatch
 * costs ~100 us a call for one query; this is one pass over the keys and values. */
/* o = sum_j p[j] v_j over keys first .. L-1, each output o[i] summed over j in order (a product
 * then an addition, one rounding each). Up to 64 outputs at a time, eight registers of eight held
 * across the keys: independent additions, where one register's would wait on each other. */
static void weighted_values(const float *p, const float *v, float *o, const int64_t *blocks, int64_t block_size,
                            int64_t first, int64_t L, int64_t v_pos, int64_t d) {
    int64_t i = 0;
    for (; i + 64 <= d; i += 64) {
        v8 acc[8] = {{0}};
        for (int64_t j = first; j < L; ++j) {
            const float *vj = v + key_slot(blocks, block_size, j) * v_pos + i;
            for (int c = 0; c < 8; ++c) acc[c] += p[j] * load8(vj + 8 * c);
        }
        memcpy(o + i, acc, sizeof acc);
    }
    for (; i + 8 <= d; i += 8) {
        v8 acc = {0};
        for (int64_t j = first; j < L; ++j) acc += p[j] * load8(v + key_slot(blocks, block_size, j) * v_pos + i);
        memcpy(o + i, &acc, sizeof acc);
    }
    for (; i < d; ++i) {
        float acc = 0.0f;
        for (int64_t j = first; j < L; ++j) acc += p[j] * v[key_slot(blocks, block_size, j) * v_pos + i];
        o[i] = acc;
    }
}

/* Up to Q_MOST query heads share their keys' loads. Their accumulators fit AVX-512's 32 vector
 * registers; with 16 (AVX2) two or three queries' spilled to the stack and a layer's attention
 * ran 2.5-4.5x slower than one query at a time, so there each query goes alone. A chunk of 64
 * values is VN_64 vectors of the widest the CPU has (lanes are independent: the same bits). */
#ifdef __AVX512F__
enum { Q_MOST = 3, VN_64 = 4 };
typedef float vn __attribute__((vector_size(64)));
#else
enum { Q_MOST = 1, VN_64 = 8 };
typedef float vn __attribute__((vector_size(32)));
#endif
static inline vn loadn(const float *p) { vn v; memcpy(&v, p, sizeof v); return v; }

/* The scores q . k_r of eight keys (rows kr[0..7], d floats each) for Q queries qs[0..Q-1] (query
 * heads that share the keys' kv head: each key chunk loaded once for all Q): each key's eight
 * lanes of fused multiply-adds over the chunks of 8, then its lanes added as
 * ((0+1)+(2+3))+((4+5)+(6+7)), the eight keys' sums at once (a transpose of the eight registers),
 * then the tail in order. A query's scores are the same bits whatever Q. Q is a constant where
 * it is inlined (1 to 3: 8 Q accumulators held in registers). */
static inline __attribute__((always_inline)) void scores8q(const int Q, const float *const *qs,
                                                           const float *const *kr, int64_t d, float out[][8]) {
    v8 acc[3][8];
    for (int c = 0; c < Q; ++c)
        for (int r = 0; r < 8; ++r) acc[c][r] = (v8){0};
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) {
        v8 qv[3];
        #pragma GCC unroll 3
        for (int c = 0; c < Q; ++c) qv[c] = load8(qs[c] + i);
        #pragma GCC unroll 8
        for (int r = 0; r < 8; ++r) {
            const v8 kv = load8(kr[r] + i);
            #pragma GCC unroll 3
            for (int c = 0; c < Q; ++c) acc[c][r] = fma8(kv, qv[c], acc[c][r]);
        }
    }
    for (int c = 0; c < Q; ++c) {
        const v8 *a = acc[c];
        v8 pair[4], quad[2];
        for (int r = 0; r < 4; ++r)  /* lanes: (2r's 0+1, 2r+1's 0+1, 2r's 2+3, 2r+1's 2+3, ...) */
            pair[r] = __builtin_shufflevector(a[2 * r], a[2 * r + 1], 0, 8, 2, 10, 4, 12, 6, 14)
                    + __builtin_shufflevector(a[2 * r], a[2 * r + 1], 1, 9, 3, 11, 5, 13, 7, 15);
        for (int r = 0; r < 2; ++r)  /* lanes: each of four keys' (0+1)+(2+3), then their (4+5)+(6+7) */
            quad[r] = __builtin_shufflevector(pair[2 * r], pair[2 * r + 1], 0, 1, 8, 9, 4, 5, 12, 13)
                    + __builtin_shufflevector(pair[2 * r], pair[2 * r + 1], 2, 3, 10, 11, 6, 7, 14, 15);
        const v8 sum = __builtin_shufflevector(quad[0], quad[1], 0, 1, 2, 3, 8, 9, 10, 11)
                     + __builtin_shufflevector(quad[0], quad[1], 4, 5, 6, 7, 12, 13, 14, 15);
        memcpy(out[c], &sum, sizeof sum);
        if (i < d)  /* (a head of a multiple of 8 has no tail: the eight sums stored at once) */
            for (int r = 0; r < 8; ++r) {
                float t = sum[r];
                for (int64_t j = i; j < d; ++j) t = fmaf(kr[r][j], qs[c][j], t);
                out[c][r] = t;
            }
    }
}

/* weighted_values for Q queries over the same values (Q a constant where inlined, 1 to 3): each
 * value chunk of 64 loaded once for all Q, every output the same sum in the same order as
 * weighted_values gives it (lanes are independent: sixteen of them or eight, the same bits). */
static inline __attribute__((always_inline)) void weighted_values_q(
        const int Q, float *const *p, const float *v, float *const *o, const int64_t *blocks,
        int64_t block_size, int64_t first, int64_t L, int64_t v_pos, int64_t d, int ask) {
    int64_t i = 0;
    for (; i + 64 <= d; i += 64) {
        vn acc[3][VN_64];
        for (int c = 0; c < Q; ++c)
            for (int m = 0; m < VN_64; ++m) acc[c][m] = (vn){0};
        for (int64_t j = first; j < L; ++j) {
            if (ask) ask_key(v + i, blocks, block_size, j + KEYS_AHEAD, L, v_pos, 64);
            const float *vj = v + key_slot(blocks, block_size, j) * v_pos + i;
            vn pj[3];  /* each query's weight of key j, in every lane */
            #pragma GCC unroll 3
            for (int c = 0; c < Q; ++c) pj[c] = p[c][j] - (vn){0};  /* x - 0 is x, -0 too: a broadcast */
            #pragma GCC unroll 8
            for (int m = 0; m < VN_64; ++m) {
                const vn vv = loadn(vj + m * (64 / VN_64));
                #pragma GCC unroll 3
                for (int c = 0; c < Q; ++c) acc[c][m] += pj[c] * vv;
            }
        }
        for (int c = 0; c < Q; ++c) memcpy(o[c] + i, acc[c], sizeof acc[c]);
    }
    if (i < d)  /* the rest of each output, chunks of 8 and a tail */
        for (int c = 0; c < Q; ++c) weighted_values(p[c], v + i, o[c] + i, blocks, block_size, first, L, v_pos, d - i);
}

/* Attention of Q query heads qs[0..Q-1] sharing one kv head (Q a constant where inlined, 1 to
 * 3), each query's numbers the same bits whatever Q: scores, each query's softmax, the weighted
 * values. p[c]: room for L floats each. */
static inline __attribute__((always_inline)) void attend_heads(
        const int Q, const float *const *qs, const float *k, const float *v, float *const *o, float *const *p,
        const int64_t *blocks, int64_t block_size, int64_t first, int64_t L,
        int64_t k_pos, int64_t v_pos, int64_t d, float scale, float cap, int ask) {
    float m[3] = {-INFINITY, -INFINITY, -INFINITY};
    for (int64_t j = first; j < L; j += 8) {  /* eight keys at a time; past L, key L - 1 again */
        const float *kr[8];
        float sc[3][8];
        for (int r = 0; r < 8; ++r) kr[r] = k + key_slot(blocks, block_size, j + r < L ? j + r : L - 1) * k_pos;
        if (ask)
            for (int r = 0; r < 8; ++r) ask_key(k, blocks, block_size, j + KEYS_AHEAD + r, L, k_pos, d);
        scores8q(Q, qs, kr, d, sc);
        for (int c = 0; c < Q; ++c)
            for (int r = 0; r < 8 && j + r < L; ++r) {
                float *pj = &p[c][j + r];
                *pj = sc[c][r] * scale;
                if (cap > 0.0f) *pj = tanhf(*pj / cap) * cap;  /* Gemma 2's soft cap, as transformers' */
                if (*pj > m[c]) m[c] = *pj;
            }
    }
    for (int c = 0; c < Q; ++c) {
        float *pc = p[c];
        /* exp(p - m), 16 at a time as whole vectors (GCC made loops over lanes scalar), summed
         * in sixteen lanes (the padding past L adds exp(-inf) = 0), then the lanes in order: one
         * chain of additions in key order had each wait on the last. */
        v16 zs = {0};
        int64_t j = first;
        for (; j + 16 <= L; j += 16) {
            const v16 e = exp16(load16(pc + j) - m[c]);
            memcpy(pc + j, &e, sizeof e);
            zs += e;
        }
        if (j < L) {
            v16 x;
            for (int l = 0; l < 16; ++l) x[l] = j + l < L ? pc[j + l] - m[c] : -INFINITY;
            const v16 e = exp16(x);
            for (int l = 0; l < 16 && j + l < L; ++l) pc[j + l] = e[l];
            zs += e;
        }
        float z = 0.0f;
        for (int l = 0; l < 16; ++l) z += zs[l];
        for (int64_t j = first; j < L; ++j) pc[j] = pc[j] / z;
    }
    weighted_values_q(Q, p, v, o, blocks, block_size, first, L, v_pos, d, ask);
}

/* rows queries q (rows, heads, d) -> out (rows, heads, d). Row r sees keys first[r] .. L[r]-1
 * through its block table blocks + r * n_blocks, or (blocks NULL, one row) keys 0 .. L-1 in place. */
typedef struct {
    const float *q, *k, *v;
    float *out;
    const int64_t *blocks, *first, *L;
    int64_t n_blocks, block_size, max_L, k_pos, k_head, v_pos, v_head, heads, rep, d, rows;
    float scale, cap;
    int64_t part;  /* query heads a unit of work: up to rep of one kv head's (its keys loaded once for 2-3) */
    int ask;  /* ask for keys ahead (ask_key): rows of their own keys, read from memory; not a
               * prompt's rows, which share one table's keys, from the cache after its first rows */
} attend_t;

/* Units of work: a row's kv head's query heads, `part` of them at a time (the last part of a kv
 * head's may be shorter). */
static inline int64_t attend_units(const attend_t *a) { return a->rows * (a->heads / a->rep) * ((a->rep + a->part - 1) / a->part); }

/* Unit u: row r, kv head g, its query heads h0 .. h1 - 1, 2 or 3 of them at a time (4: two of
 * 2). p: three buffers of max_L floats. */
static void attend_unit(const attend_t *a, int64_t u, float *const *p) {
    const int64_t parts = (a->rep + a->part - 1) / a->part, kv_heads = a->heads / a->rep;
    /* Rows in the order 0, n-1, 1, n-2, ...: a prompt's row r sees r + 1 keys, so the threads'
     * even shares of units in row order gave the last one 3/4 of the work (it ran while the
     * first waited); paired first and last rows cost the same in any share. */
    const int64_t ur = u / (kv_heads * parts), r = ur % 2 ? a->rows - 1 - ur / 2 : ur / 2;
    const int64_t g = u / parts % kv_heads, h0 = g * a->rep + u % parts * a->part;
    const int64_t h1 = h0 + a->part < (g + 1) * a->rep ? h0 + a->part : (g + 1) * a->rep;
    const int64_t *blocks = a->blocks ? a->blocks + r * a->n_blocks : NULL;
    const float *k = a->k + g * a->k_head, *v = a->v + g * a->v_head;
    for (int64_t h = h0; h < h1;) {
        const int64_t left = h1 - h;
        int Q = left >= 3 && left != 4 ? 3 : left >= 2 ? 2 : 1;
        Q = Q < Q_MOST ? Q : Q_MOST;
        const float *qs[3];
        float *os[3];
        for (int c = 0; c < Q; ++c) {
            qs[c] = a->q + (r * a->heads + h + c) * a->d;
            os[c] = a->out + (r * a->heads + h + c) * a->d;
        }
        #define ATTEND(QC) attend_heads(QC, qs, k, v, os, p, blocks, a->block_size, a->first[r], a->L[r], \
                                        a->k_pos, a->v_pos, a->d, a->scale, a->cap, a->ask)
        if (Q == 3) ATTEND(3); else if (Q == 2) ATTEND(2); else ATTEND(1);
        #undef ATTEND
        h += Q;
    }
}

/* A decode row's unit: two query heads (their keys and values loaded once for both: Gemma 3
 * 270M's 4 heads and Llama-3.2-1B's 32 attended 1.1-1.3x faster on two threads than head by head,
 * or by all of a kv head's heads at once; SmolLM2's 9 the same); a prompt's rows: all of them. */
static inline int64_t attend_part(int64_t rows, int64_t heads, int64_t kv_heads, int threads) {
    const int64_t rep = heads / kv_heads;
    if (Q_MOST == 1) return 1;
    return rows * kv_heads >= 8 * (threads > 1 ? threads : 1) ? rep : rep < 2 ? rep : 2;
}

static void attend_range(void *ctx, int64_t begin, int64_t end) {
    const attend_t *a = ctx;
    const int64_t m = a->max_L > 0 ? a->max_L : 1;
    float *buf = malloc(sizeof(float) * 3 * m);
    if (!buf) abort();
    float *const p[3] = {buf, buf + m, buf + 2 * m};
    for (int64_t u = begin; u < end; ++u) attend_unit(a, u, p);
    free(buf);
}

void token_lab_attend(const float *q, const float *k, const float *v, float *out, int64_t rows,
                      const int64_t *blocks, int64_t n_blocks, int64_t block_size,
                      const int64_t *first, const int64_t *L, int64_t max_L,
                      int64_t k_pos, int64_t k_head, int64_t v_pos, int64_t v_head,
                      int64_t heads, int64_t kv_heads, int64_t d, float scale, float cap, int threads) {
    attend_t a = {q, k, v, out, blocks, first, L, n_blocks, block_size, max_L, k_pos, k_head, v_pos, v_head,
                  heads, heads / kv_heads, d, rows, scale, cap, attend_part(rows, heads, kv_heads, threads),
                  rows == 1 || n_blocks > 0};
    const int64_t bytes = rows * max_L * kv_heads * d * 2 * (int64_t)sizeof(float);
    split(attend_range, &a, attend_units(&a), bytes, threads, by_size(attend_costs, bytes));
}
