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
