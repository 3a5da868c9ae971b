/* Products on a weight's table: float32 rows, the file's blocks, the repacked integers (included
 * by kernels.c, after quant.c, quant_simd.c and islices.c).
 *
 * Y[:, o0:o1] of Y = X W^T, X (rows, in) rows x_stride floats apart, Y (rows, out): each row of a
 * float32 part read in place, each of a file part dequantized (fused, or into buf: in floats) and
 * summed in dot()'s order; a repacked part's groups of 16 rows against the activations' slices xs
 * (islices.c: NULL where the weight has no such part).
 *
 * A quantized row asks at its start for the bytes AHEAD past it (kernels.c's ahead(): a float32
 * row asks as dot() reads it). Without it the hardware's prefetcher alone kept SmolLM2's one-call
 * step at 13.2 ms against 10.0 on an Intel Xeon (2 vCPUs; bench/measured/cpu-quant-*). */

/* A part's bytes: rows, or a repacked part's groups of 16, times its stride. */
static inline int64_t part_bytes(const int64_t *p) {
    return (is_int_type(p[P_TYPE]) ? (p[P_ROWS] + GROUP - 1) / GROUP : p[P_ROWS]) * p[P_ROW_BYTES];
}

/* The bytes a weight's table reads: its parts'. */
static int64_t weight_bytes(const int64_t *w) {
    int64_t bytes = 0;
    const int64_t *p = w + W_FIRST;
    for (int64_t k = 0; k < w[W_PARTS]; ++k, p += PART_FIELDS) bytes += part_bytes(p);
    return bytes;
}

/* Whether any part of the weight is repacked (its products then read the activations' slices). */
static int weight_is_int(const int64_t *w) {
    const int64_t *p = w + W_FIRST;
    for (int64_t k = 0; k < w[W_PARTS]; ++k, p += PART_FIELDS)
        if (is_int_type(p[P_TYPE])) return 1;
    return 0;
}

static void weight_range(const int64_t *w, const float *x, const xblk_t *xs, float *y, int64_t rows,
                         int64_t x_stride, int64_t o0, int64_t o1, float *buf) {
    const int64_t out = w[W_OUT], in = w[W_IN];
    for (int64_t o = o0; o < o1;) {
        int64_t row;
        const int64_t *p = part_of(w, o, &row);
        if (is_int_type(p[P_TYPE])) {  /* to the range's or the part's end, whichever first */
            const int64_t end = o1 - o < p[P_ROWS] - row ? o1 - o : p[P_ROWS] - row;
            int_rows(p[P_TYPE], (const uint8_t *)(intptr_t)p[P_DATA], p[P_ROW_BYTES], in, xs, rows, y + o, out,
                     row, row + end);
            o += end;
            continue;
        }
        const uint8_t *br = (const uint8_t *)(intptr_t)p[P_DATA] + row * p[P_ROW_BYTES];
        if (p[P_TYPE] != GGML_F32)
            for (int64_t c = 0; c < p[P_ROW_BYTES]; c += 64) __builtin_prefetch(br + AHEAD + c);
        const float *wr;
        const qdot_fn fn = in % 32 == 0 ? fused(p[P_TYPE]) : NULL;  /* whole chunks of 32 (bfloat16 rows need not be) */
        if (fn) {
            int64_t r = 0;
            const qdot4_fn fn4 = rows >= 4 ? fused4(p[P_TYPE]) : NULL;
            if (fn4)
                for (; r + 4 <= rows; r += 4) fn4(br, x + r * x_stride, x_stride, in, y + r * out + o, out);
            for (; r + 2 <= rows; r += 2)
                fn(br, x + r * x_stride, x + (r + 1) * x_stride, in, y + r * out + o, y + (r + 1) * out + o);
            if (r < rows) fn(br, x + r * x_stride, NULL, in, y + r * out + o, NULL);
            ++o;
            continue;
        }
        if (p[P_TYPE] == GGML_F32) {
            wr = (const float *)br;
        } else {
            dequant_row(p[P_TYPE], (const uint8_t *)(intptr_t)p[P_DATA], p[P_ROW_BYTES], row, buf, in);
            wr = buf;
        }
        int64_t r = 0;
        for (; r + 2 <= rows; r += 2)
            dot2(wr, x + r * x_stride, x + (r + 1) * x_stride, in, y + r * out + o, y + (r + 1) * out + o);
        if (r < rows) y[r * out + o] = dot(wr, x + r * x_stride, in);
        ++o;
    }
}

/* A product's rows go to threads in groups of 16 (a repacked part's group is one thread's). */
typedef struct { const int64_t *w; const float *x; const xblk_t *xs; float *y; int64_t rows, x_stride; } qrows_t;

static void qrows_range(void *ctx, int64_t begin, int64_t end) {
    const qrows_t *a = ctx;
    float *buf = malloc(sizeof(float) * a->w[W_IN]);
    if (!buf) abort();
    const int64_t out = a->w[W_OUT];
    weight_range(a->w, a->x, a->xs, a->y, a->rows, a->x_stride, begin * GROUP, end * GROUP < out ? end * GROUP : out, buf);
    free(buf);
}

static costs_t qrows_costs[48];

/* Y (rows, out) = X W^T for the weight's table w; X (rows, in) with rows x_stride floats apart. */
void token_lab_qrows(const int64_t *w, const float *x, float *y, int64_t rows, int64_t x_stride, int threads) {
    xblk_t *xs = NULL;
    if (weight_is_int(w)) {
        xs = malloc(sizeof(xblk_t) * rows * (w[W_IN] / 32) + 1);
        if (!xs) abort();
        slice_rows(x, rows, w[W_IN], x_stride, xs);
    }
    qrows_t a = {w, x, xs, y, rows, x_stride};
    const int64_t bytes = weight_bytes(w);
    /* Costs by the bytes read times the rows: a prefill's product and a decode step's are apart. */
    split(qrows_range, &a, (w[W_OUT] + GROUP - 1) / GROUP, bytes * rows, threads, by_size(qrows_costs, bytes * rows));
    free(xs);
}
