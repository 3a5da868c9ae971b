/* A step's statistics (included by kernels.c). */
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

/* Row xr's k largest into val/id (sorted, ties by index); how many, or 0 where it has a NaN. */
static int64_t row_top_k(const float *xr, int64_t V, int64_t k, int64_t *id, float *val) {
    {
        int64_t n = 0, j = 0, nan = 0;
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
        return nan ? 0 : n;  /* torch.topk ranks a NaN first */
    }
}

void token_lab_top_k(const float *x, int64_t rows, int64_t V, int64_t k, int64_t *ids, float *vals,
                     int64_t *found) {
    for (int64_t r = 0; r < rows; ++r) found[r] = row_top_k(x + r * V, V, k, ids + r * k, vals + r * k);
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

/* ---------------------------------------------------------------- every row's numbers at once */

typedef float v8f __attribute__((vector_size(32)));
typedef double v8d __attribute__((vector_size(64)));

/* One row's numbers: its k largest (as row_top_k), then with e = exp(x - max), z = sum(e) and
 * m = sum(e * x) (the products in float32, the sums in float64: eight lanes for each half of 16,
 * added in order at the end). */
static void row_stats(const float *xr, int64_t V, int64_t k, int64_t *id, float *val, int64_t *found,
                      double *z, double *m) {
    *found = row_top_k(xr, V, k, id, val);
    if (*found < k) return;
    const float top = val[0];
    v8d za = {0}, zb = {0}, ma = {0}, mb = {0};
    for (int64_t j = 0; j < V; j += 16) {
        v16 xs;
        if (j + 16 <= V) {
            xs = load16(xr + j);
        } else {  /* the tail: padded with -inf, whose e is 0 */
            for (int l = 0; l < 16; ++l) xs[l] = j + l < V ? xr[j + l] : -INFINITY;
        }
        const v16 e = exp16(xs - top);
        v16 ex = e * xs;
        v16i exbits;  /* where e is 0, e * x is 0 (x may be -inf: 0 * -inf is NaN) */
        memcpy(&exbits, &ex, sizeof ex);
        exbits &= ~(e == 0.0f);
        memcpy(&ex, &exbits, sizeof ex);
        v8f lo, hi, xlo, xhi;
        memcpy(&lo, &e, 32);
        memcpy(&hi, (const char *)&e + 32, 32);
        memcpy(&xlo, &ex, 32);
        memcpy(&xhi, (const char *)&ex + 32, 32);
        za += __builtin_convertvector(lo, v8d);
        zb += __builtin_convertvector(hi, v8d);
        ma += __builtin_convertvector(xlo, v8d);
        mb += __builtin_convertvector(xhi, v8d);
    }
    double zt = 0.0, mt = 0.0;
    for (int l = 0; l < 8; ++l) { zt += za[l] + zb[l]; mt += ma[l] + mb[l]; }
    *z = zt;
    *m = mt;
}

/* sum(exp(x - top)) over the entries where `forbidden` is nonzero: row_stats' z over those alone,
 * the same exponentials added in the same lanes and order (with the others 0), so it is never
 * more than z: a constraint's masked mass is at most 1. */
void token_lab_masked_exp_sum(const float *xr, int64_t V, float top, const uint8_t *forbidden, double *out) {
    v8d za = {0}, zb = {0};
    for (int64_t j = 0; j < V; j += 16) {
        v16 xs;
        for (int l = 0; l < 16; ++l) xs[l] = j + l < V && forbidden[j + l] ? xr[j + l] : -INFINITY;
        const v16 e = exp16(xs - top);
        v8f lo, hi;
        memcpy(&lo, &e, 32);
        memcpy(&hi, (const char *)&e + 32, 32);
        za += __builtin_convertvector(lo, v8d);
        zb += __builtin_convertvector(hi, v8d);
    }
    double zt = 0.0;
    for (int l = 0; l < 8; ++l) zt += za[l] + zb[l];
    *out = zt;
}

typedef struct {
    const float *x;
    int64_t V, k, *ids, *found;
    float *vals;
    double *z, *m;
} stats_t;

static void stats_range(void *ctx, int64_t begin, int64_t end) {
    const stats_t *a = ctx;
    for (int64_t r = begin; r < end; ++r)
        row_stats(a->x + r * a->V, a->V, a->k, a->ids + r * a->k, a->vals + r * a->k, a->found + r, a->z + r, a->m + r);
}

static costs_t stats_costs[48];

/* x (rows, V): each row's k largest (ids, vals), found (k, or less where a row has a NaN: then its
 * z and m are not written), z and m; rows shared between threads, each row computed alone. */
void token_lab_row_stats(const float *x, int64_t rows, int64_t V, int64_t k, int64_t *ids, float *vals,
                         int64_t *found, double *z, double *m, int threads) {
    stats_t a = {x, V, k, ids, found, vals, z, m};
    split(stats_range, &a, rows, rows * V * (int64_t)sizeof(float), threads, by_size(stats_costs, rows * V * 4));
}

/* ---------------------------------------------------------------- a drawn row's token and the rest
 * The draw of sampling/stages.py's sample() for rows of probabilities p (each V, apart), each with its
 * uniform u: the first token whose running sum of p in float64, added in vocabulary order (what
 * torch's cumsum of p.double() gives), exceeds u * total, total being the whole row's running sum,
 * and strictly below it (V where the row has a NaN or sums to 0: no token). The same numbers as
 * sample()'s cumsum and searchsorted, without their float64 copies of the row: one pass keeps the
 * running sum at every block's end, and the draw's block is summed again from there.
 * Then the row's probability outside its k candidates (skip: their positions) and its token (the
 * forced one where forced >= 0: a row whose token is given draws all the same, and keeps the given),
 * summed in float64 in 32 lanes (element i in lane i % 32, the lanes added in order), in the same
 * pass: exactly 0 where every other probability is. Each row alone, whatever the others. */
typedef struct {
    const float *const *p;  /* each row's probabilities (V) */
    const double *u;
    const int64_t *skip, *forced;
    int64_t V, k, *token;
    double *rest;
} draw_t;

enum { DRAW_MARKS = 1024, LANES = 32 };

static inline int marked(const uint64_t *bits, int64_t e) { return (int)(bits[e >> 6] >> (e & 63)) & 1; }

static void draw_row(const float *p, int64_t V, double u, const int64_t *skip, int64_t k, int64_t forced,
                     int64_t *token, double *rest) {
    const int64_t block = V <= 512 * DRAW_MARKS ? 512 : (V + DRAW_MARKS - 1) / DRAW_MARKS / 64 * 64 + 64;
    double marks[DRAW_MARKS + 1];  /* the running sum before each block */
    double acc[LANES] = {0};
    uint64_t *bits = calloc((size_t)(V + 63) / 64, sizeof(uint64_t));  /* the positions left out */
    if (!bits) abort();
    for (int64_t j = 0; j < k; ++j)
        if (skip[j] >= 0 && skip[j] < V) bits[skip[j] >> 6] |= 1ull << (skip[j] & 63);
    double run = 0.0;
    for (int64_t b = 0, i = 0; i < V; ++b, i += block) {  /* block: a multiple of 64, so of LANES */
        marks[b] = run;
        const int64_t end = i + block < V ? i + block : V;
        uint64_t any = 0;
        for (int64_t w = i >> 6; w <= (end - 1) >> 6; ++w) any |= bits[w];
        for (int64_t e = i; e < end; ++e) run += (double)p[e];
        int64_t e = i;
        if (!any)
            for (; e + LANES <= end; e += LANES)
                for (int j = 0; j < LANES; ++j) acc[j] += (double)p[e + j];
        for (; e < end; ++e)
            if (!marked(bits, e)) acc[e % LANES] += (double)p[e];
    }
    const double total = run;
    int64_t t = V;
    if (total > 0.0) {  /* not NaN, something to draw */
        double target = u * total;
        const double below = nextafter(total, 0.0);
        if (!(target < below)) target = below;
        for (int64_t b = 0, i = 0; i < V && t == V; ++b, i += block) {
            const int64_t end = i + block < V ? i + block : V;
            const double next = end < V ? marks[b + 1] : total;
            if (!(next > target)) continue;  /* the running sum passes the target in a later block */
            double r = marks[b];
            for (int64_t e = i; e < end; ++e) {
                r += (double)p[e];
                if (r > target) { t = e; break; }
            }
        }
    }
    *token = t;
    const int64_t c = forced >= 0 ? forced : t < V ? t : V - 1;  /* the row's token (none drawn: the last, as
                                                                 * step_stats clamps it) */
    if (c < V && !marked(bits, c)) {  /* its lane summed again without it */
        bits[c >> 6] |= 1ull << (c & 63);
        const int lane = (int)(c % LANES);
        acc[lane] = 0.0;
        for (int64_t e = lane; e < V; e += LANES)
            if (!marked(bits, e)) acc[lane] += (double)p[e];
    }
    free(bits);
    double s = 0.0;
    for (int j = 0; j < LANES; ++j) s += acc[j];
    *rest = s;
}

static void draw_range(void *ctx, int64_t begin, int64_t end) {
    const draw_t *a = ctx;
    for (int64_t r = begin; r < end; ++r)
        draw_row(a->p[r], a->V, a->u[r], a->skip + r * a->k, a->k, a->forced[r], a->token + r, a->rest + r);
}

static costs_t draw_costs[48];

void token_lab_draw_rows(const float *const *p, int64_t rows, int64_t V, const double *u, const int64_t *skip, int64_t k,
                         const int64_t *forced, int64_t *token, double *rest, int threads) {
    draw_t a = {p, u, skip, forced, V, k, token, rest};
    split(draw_range, &a, rows, rows * V * (int64_t)sizeof(float), threads, by_size(draw_costs, rows * V * 4));
}
