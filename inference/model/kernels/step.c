/* A whole decode step in one call (included by kernels.c, after the products). */
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
 * attend_unit, token_lab_rms_norm, rotate, act), so its numbers are the same bits as the
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
       D_BLOCK_SIZE, D_CTX_OFFSET, D_MAX_L, D_ROTARY, D_FIELDS };
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
static inline int64_t claim(int64_t *counter, int64_t total, int64_t chunk, int nth, int64_t align, int64_t *end) {
    int64_t b = __atomic_load_n(counter, __ATOMIC_RELAXED), e;
    do {
        if (b >= total) return b;
        const int64_t share = (total - b) / (2 * nth);
        e = b + (share > chunk ? share : chunk);
        e = (e + align - 1) / align * align;  /* a repacked weight's groups of 16 rows stay whole */
        if (e > total) e = total;
    } while (!__atomic_compare_exchange_n(counter, &b, e, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    *end = e;
    return b;
}
#define CHUNKS(counter, total, chunk, nth, align, b, e) \
    for (int64_t b, e; (b = claim(counter, total, chunk, nth, align, &e)) < (total);)

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

/* The slices of x (n, in) in xs where w reads them (a repacked weight), else NULL. Each thread
 * slices its own copy: n rows of `in` values cost far less than a barrier. */
static const xblk_t *slices_for(const int64_t *w, const float *x, int64_t n, int64_t in, xblk_t *xs) {
    if (!weight_is_int(w)) return NULL;
    slice_rows(x, n, in, in, xs);
    return xs;
}

/* h (n, hidden) += x W^T, W (hidden, in) a weight's table (quant.c): each chunk's outputs added
 * by the thread that made them. With `norm` (a norm after the branch) the product's rows are
 * whole first: then each row is normed and added by one thread, counters[1] handing them out.
 * buf: this thread's row of dequantized weights. */
static void add_product(step_t *s, int nth, const int64_t *w, const float *x, int64_t in, int64_t *counters,
                        const float *norm, float *buf, xblk_t *xs) {
    const int64_t n = s->dims[D_N], hidden = s->dims[D_HIDDEN];
    float *h = s->ptrs[P_H];
    const xblk_t *sl = slices_for(w, x, n, in, xs);
    CHUNKS(&counters[0], hidden, chunk_rows(w), nth, GROUP, o0, o1) {
        weight_range(w, x, sl, s->y, n, in, o0, o1, buf);
        if (!norm)
            for (int64_t r = 0; r < n; ++r)
                for (int64_t o = o0; o < o1; ++o) h[r * hidden + o] = h[r * hidden + o] + s->y[r * hidden + o];
    }
    if (!norm) return;
    barrier(s, nth);
    CHUNKS(&counters[1], n, 1, nth, 1, r0, r1) {
        token_lab_rms_norm(s->y + r0 * hidden, norm, s->y + r0 * hidden, r1 - r0, hidden, s->eps);
        for (int64_t i = r0 * hidden; i < r1 * hidden; ++i) h[i] = h[i] + s->y[i];
    }
}

static void decode_body(step_t *s, int nth) {
    const int64_t *dm = s->dims;
    const int64_t n = dm[D_N], hidden = dm[D_HIDDEN], heads = dm[D_HEADS], kv_heads = dm[D_KV_HEADS],
                  d = dm[D_HEAD_DIM], ffn = dm[D_FFN], vocab = dm[D_VOCAB], n_layers = dm[D_LAYERS],
                  rd = dm[D_ROTARY];
    const int64_t units = heads + 2 * kv_heads, width = units * d, kv_width = kv_heads * d;
    float *h = s->ptrs[P_H];
    const int64_t *slots = s->ptrs[P_SLOTS], *blocks = s->ptrs[P_BLOCKS], *lengths = s->ptrs[P_LENGTHS];
    float *x = malloc(sizeof(float) * n * hidden);  /* this thread's normed rows */
    const int64_t max_l = dm[D_MAX_L] > 0 ? dm[D_MAX_L] : 1;
    float *scores = malloc(sizeof(float) * 3 * max_l);  /* attention's, for up to three heads */
    float *const p[3] = {scores, scores + max_l, scores + 2 * max_l};
    const int64_t widest = hidden > ffn ? (hidden > heads * d ? hidden : heads * d) : (ffn > heads * d ? ffn : heads * d);
    float *buf = malloc(sizeof(float) * widest);  /* a row of dequantized weights */
    xblk_t *xs = malloc(sizeof(xblk_t) * n * (widest / 32 + 1));  /* this thread's slices of a product's input */
    if (!x || !scores || !buf || !xs) abort();
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
        const xblk_t *xq = slices_for(wqkv, x, n, hidden, xs);
        CHUNKS(&s->counters[stage], units, 1, nth, 1, u0, u1) {
            weight_range(wqkv, x, xq, s->qkv, n, hidden, u0 * d, u1 * d, buf);
            for (int64_t r = 0; r < n; ++r)
                for (int64_t u = u0; u < u1; ++u) {
                    float *row = s->qkv + r * width + u * d;
                    if (bqkv)
                        for (int64_t i = 0; i < d; ++i) row[i] = row[i] + bqkv[u * d + i];
                    if (q_norm && u < heads + kv_heads)
                        token_lab_rms_norm(row, u < heads ? q_norm : k_norm, row, 1, d, s->eps);
                    const float *c = cos + r * rd, *sn = sin + r * rd;  /* tables (n, rd): the dims RoPE turns */
                    if (u < heads) rotate(row, c, sn, s->q + (r * heads + u) * d, d, rd);
                    else if (u < heads + kv_heads) rotate(row, c, sn, k_pool + slots[r] * kv_width + (u - heads) * d, d, rd);
                    else memcpy(v_pool + slots[r] * kv_width + (u - heads - kv_heads) * d, row, sizeof(float) * d);
                }
        }
        ++stage;
        barrier(s, nth);

        /* ---- attention: (row, head) pairs claimed in turn */
        const int64_t offset = dm[D_CTX_OFFSET] * kv_width;
        const attend_t at = {s->q, k_pool + offset, v_pool + offset, s->att, blocks, first, lengths, dm[D_N_BLOCKS],
                             dm[D_BLOCK_SIZE], dm[D_MAX_L], kv_width, d, kv_width, d, heads, heads / kv_heads, d, n,
                             s->scale, 0.0f, attend_part(n, heads, kv_heads, nth), 1};
        CHUNKS(&s->counters[stage], attend_units(&at), 1, nth, 1, u0, u1) for (int64_t u = u0; u < u1; ++u)
            attend_unit(&at, u, p);
        ++stage;
        barrier(s, nth);

        /* ---- h += [RMSNorm](att Wo^T) */
        add_product(s, nth, (const int64_t *)(intptr_t)t[L_WO], s->att, heads * d, &s->counters[stage],
                    (const float *)(intptr_t)t[L_POST_ATTN_NORM], buf, xs);
        stage += 2;
        barrier(s, nth);

        /* ---- g = act(gate) * up: gate row i and up row i by the same thread */
        token_lab_rms_norm(h, (const float *)(intptr_t)t[L_FFN_NORM], x, n, hidden, s->eps);
        const int gelu = (int)dm[D_GELU];
        const int64_t *w13 = (const int64_t *)(intptr_t)t[L_W13];
        const xblk_t *xf = slices_for(w13, x, n, hidden, xs);
        CHUNKS(&s->counters[stage], ffn, chunk_rows(w13) / 2, nth, GROUP, i0, i1) {
            weight_range(w13, x, xf, s->gu, n, hidden, i0, i1, buf);
            weight_range(w13, x, xf, s->gu, n, hidden, ffn + i0, ffn + i1, buf);
            for (int64_t r = 0; r < n; ++r) {
                const float *gate = s->gu + r * 2 * ffn, *up = gate + ffn;
                act_span(gate + i0, up + i0, s->g + r * ffn + i0, i1 - i0, gelu);
            }
        }
        ++stage;
        barrier(s, nth);

        /* ---- h += [RMSNorm](g Wdown^T) */
        add_product(s, nth, (const int64_t *)(intptr_t)t[L_W2], s->g, ffn, &s->counters[stage],
                    (const float *)(intptr_t)t[L_POST_FFN_NORM], buf, xs);
        stage += 2;
        barrier(s, nth);
    }

    /* ---- logits = RMSNorm(h) Whead^T */
    token_lab_rms_norm(h, s->ptrs[P_NORM], x, n, hidden, s->eps);
    const xblk_t *xh = slices_for(s->ptrs[P_HEAD], x, n, hidden, xs);
    CHUNKS(&s->counters[stage], vocab, chunk_rows(s->ptrs[P_HEAD]), nth, GROUP, o0, o1) {
        weight_range(s->ptrs[P_HEAD], x, xh, s->ptrs[P_LOGITS], n, hidden, o0, o1, buf);
    }
    free(xs);
    free(x);
    free(scores);
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
