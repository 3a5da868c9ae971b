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
