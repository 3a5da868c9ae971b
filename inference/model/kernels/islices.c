/* Integer products on a GGUF file's blocks (included by kernels.c, after ipack.c).
 *
 * A quantized weight is integers q with scales per block: w = d (q - offset), d q + m, d value[q]
 * (IQ4's 16 non-linear int8 values), or a K-quant's d sc q - dmin mn. The activations are float32;
 * each block of 32 of them is split here into three int8 slices with one shared power-of-two scale
 * s (the Ozaki scheme: three bytes carry a float32's 24 bits):
 *
 *     X = round(x 2^16 / s) = a1 2^16 + a2 2^8 + a3,   x = s 2^-16 X + r,   |r| <= s 2^-17,
 *
 * X's balanced base-256 digits (a2, a3 in [-128, 127]; |a1| <= 127 as |X| <= 127 2^16), every step
 * exact (s is a power of two; the digits are integer operations), and |r| under 2^-16 / 127 (about
 * 2^-23) of the block's largest |x|: a float32's own rounding of it. Each slice's sum with the
 * weights' integers, T_k = sum(q a_k), is exact (AVX-512 VNNI's vpdpbusd adds 64 byte products an
 * instruction into int32 lanes); hi = T1 2^8 + T2 is exact in int32, and the block's scales are
 * applied once, in float32:
 *
 *     y = fma(d s 2^-16, fma(float(hi), 2^8, float(T3)), y)     (and the min's term after it).
 *
 * The terms, in this order: a 32-input block's (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL), then Q4_1's
 * and Q5_1's m times the activations' sum; per 32 inputs of a K-quant, Q4_K's and Q5_K's d sc and
 * then dmin mn times the sum, IQ4_XS's d sc; Q6_K's and Q3_K's scales cover 16 inputs, so each half
 * is a term; Q2_K's 4-bit scales and mins cover 16 too, and are applied in int32 (sc0 hi0 + sc1 hi1,
 * and mn0 and mn1 times the halves' activation sums): two terms per 32 inputs, as Q4_K's. Weights
 * stored above the file's q (Q4_0 + 8, Q5_0 + 16, Q8_0's and the IQ4 values + 128 as unsigned
 * bytes, Q3_K + 4, Q6_K + 32) have off times the activations' own hi and lo taken off, in int32.
 *
 * int32 ranges (|T1| <= inputs qmax 127, |T2|, |T3| <= inputs qmax 128, so |hi| <= inputs qmax
 * 32640, qmax the largest |q| after the offset): 4-bit weights' 32 inputs (15.7e6), Q5_0's
 * (16 x 32 x 32640 = 16.7e6), Q6_K's and Q3_K's 16, and Q2_K's mins (15 x 2 x 16 x 32640) stay under
 * 2^24 = 16.8e6: exact as floats too. Q5_1's and Q5_K's (3.2e7), Q2_K's scaled halves
 * (15 x 2 x 16 x 3 x 32640 = 4.7e7) and the unsigned bytes' (32 x 255 x 32640 = 2.7e8, less 128
 * times the activations': 1.3e8) are above 2^24 and below 2^31: exact in int32, rounded once more
 * converted to float (the bound counts it).
 *
 * So the only differences from the float32 product of the dequantized weights are the slices'
 * remainder and float32 roundings, a few a block instead of one a weight: model/products.py's
 * BOUND, derived in docs/design.md and tested on random and real rows (tests/model/test_islices.py).
 *
 * The weights are repacked at load (ipack.c): 16 rows at a time, byte 4r + k of register J
 * holding row r's weight for input 4J + k, so a vpdpbusd adds four products into each row's own
 * lane and the 16 lanes are 16 outputs: no sum across lanes, and each output is the same sequence
 * of operations whatever else the weight or the step holds (the same bits alone or in a batch of
 * any size, on one thread or two). Per group of 16 rows and block, the layouts (bytes):
 *
 *   I4_0  q4 256, d 32                  I2_K  per 256 inputs: d 32, dmin 32, sc|mn 16x16 (the
 *   I4_1  q4 256, d 32, m 32                  file's bytes), then 8 x q2 128
 *   I5_0  q4 256, q5 64, d 32           I3_K  d 32, sc 16x16 (int8), then 8 x (q2 128 + q3 64)
 *   I5_1  q4 256, q5 64, d 32, m 32     I4_K  d 32, dmin 32, sc 8x16, mn 8x16, then 8 x q4 256
 *   I8_0  q8 512, d 32                  I5_K  as I4_K, each 32 inputs q4 256 + q5 64
 *   IN_L  q4 256, d 32 (IQ4_NL)         I6_K  d 32, sc 16x16 (int8), then 8 x (q4 256 + q2 128)
 *                                       IX_S  d 32, sc 8x16 (int8), then 8 x q4 256 (IQ4_XS)
 *
 * q4: register J' (0-3) of 64 bytes holds register J' in its low nibbles and J' + 4 in its high
 * ones (IQ4's: indices, each made its value + 128 by a byte shuffle as it is read); q5 and q3:
 * register J's fifth (third) bits as 64 bits; q2: two bits, register 4p + m's in bits 2m-2m+1 of
 * plane p (Q6_K's top two bits; Q2_K's and Q3_K's low two); q8: Q8_0's q + 128 (an unsigned
 * byte). The file's bytes, but for unpacked scales (Q3_K +3.6%, Q4_K +2.8%, Q5_K +2.3%, IQ4_XS +1.5%).
 *
 * Without AVX-512 VNNI the same integers and the same float32 operations in the same order run in
 * plain C (the same bits: tests/model/test_kernels_isa.py). */
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

enum { SLICES = 3 };

/* ---------------------------------------------------------------- the activations' slices */
typedef struct {
    int8_t a[SLICES][32];
    float unit;     /* s 2^-16: the value of 1 in lo (and of 2^8 in hi) */
    int32_t hi[2];  /* each half's (16 values) a1 2^8 + a2 sums */
    int32_t lo[2];  /* and a3 */
    float sx;       /* the block's sum as its slices carry it: unit (2^8 hi + lo) */
    int32_t pad[6];
} xblk_t;  /* 128 bytes */

static int slices_kept = SLICES;  /* tests only (token_lab_set_slices): fewer drops the last ones */
void token_lab_set_slices(int n) { slices_kept = n; }

/* The exponent e of s = 2^e, the least with 127 s >= mx, clamped so that s 2^-16 stays normal. */
static inline int slice_exponent(float mx) {
    if (!(mx > 0.0f) || !isfinite(mx)) return -100;
    int e;
    frexpf(mx / 127.0f, &e);
    while (e > -100 && ldexpf(127.0f, e - 1) >= mx) --e;
    while (ldexpf(127.0f, e) < mx) ++e;
    return e < -100 ? -100 : e;
}

/* X = round(x 2^16 / s) (|X| <= 127 2^16: exact in float32 and int32) as three balanced base-256
 * digits, X = a1 2^16 + a2 2^8 + a3 with a2, a3 in [-128, 127] (then |a1| <= 127): integer steps,
 * exact. Slices past slices_kept are 0 (their value dropped). */
static inline void digits(int32_t X, int32_t *a1, int32_t *a2, int32_t *a3) {
    *a3 = ((X + 128) & 255) - 128;
    const int32_t X2 = (X - *a3) >> 8;  /* exact: X - a3 is a multiple of 256 */
    *a2 = ((X2 + 128) & 255) - 128;
    *a1 = (X2 - *a2) >> 8;
    if (slices_kept < 3) *a3 = 0;
    if (slices_kept < 2) *a2 = 0;
}

/* The sums of each half's slices, sums[half][k], into the block's hi, lo and sx. */
static void slice_sums(xblk_t *o, int e, int finite, const int32_t sums[2][SLICES]) {
    for (int h = 0; h < 2; ++h) {
        o->hi[h] = sums[h][0] * 256 + sums[h][1];
        o->lo[h] = sums[h][2];
    }
    o->unit = finite ? ldexpf(1.0f, e - 16) : NAN;  /* an infinite or NaN activation: NaN out */
    o->sx = o->unit * fmaf((float)(o->hi[0] + o->hi[1]), 256.0f, (float)(o->lo[0] + o->lo[1]));
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
static void slice_block(const float *x, xblk_t *o) {
    const __m512 r[2] = {_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16)};
    const __m512 inf = _mm512_set1_ps(INFINITY);  /* not below infinity: an infinity or a NaN */
    const int finite = !(_mm512_cmp_ps_mask(_mm512_abs_ps(r[0]), inf, _CMP_NLT_UQ)
                         | _mm512_cmp_ps_mask(_mm512_abs_ps(r[1]), inf, _CMP_NLT_UQ));
    const int e = slice_exponent(finite ? _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(r[0]), _mm512_abs_ps(r[1]))) : NAN);
    const __m512 inv = _mm512_set1_ps(ldexpf(1.0f, 16 - e));
    const __m512i c128 = _mm512_set1_epi32(128), c255 = _mm512_set1_epi32(255);
    int32_t sums[2][SLICES];
    for (int h = 0; h < 2; ++h) {
        __m512 X = _mm512_roundscale_ps(_mm512_mul_ps(r[h], inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        if (!finite) X = _mm512_setzero_ps();
        const __m512i Xi = _mm512_cvtps_epi32(X);
        const __m512i a3 = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(Xi, c128), c255), c128);
        const __m512i X2 = _mm512_srai_epi32(_mm512_sub_epi32(Xi, a3), 8);
        const __m512i a2 = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(X2, c128), c255), c128);
        const __m512i a1 = _mm512_srai_epi32(_mm512_sub_epi32(X2, a2), 8);
        const __m512i a[SLICES] = {a1, slices_kept < 2 ? _mm512_setzero_si512() : a2,
                                   slices_kept < 3 ? _mm512_setzero_si512() : a3};
        for (int k = 0; k < SLICES; ++k) {
            sums[h][k] = _mm512_reduce_add_epi32(a[k]);
            _mm_storeu_si128((__m128i *)(o->a[k] + 16 * h), _mm512_cvtepi32_epi8(a[k]));
        }
    }
    slice_sums(o, e, finite, sums);
}
#else
static void slice_block(const float *x, xblk_t *o) {
    float mx = 0.0f;
    int finite = 1;
    for (int i = 0; i < 32; ++i) {
        finite &= isfinite(x[i]) != 0;
        mx = fabsf(x[i]) > mx ? fabsf(x[i]) : mx;
    }
    const int e = slice_exponent(finite ? mx : NAN);
    const float inv = ldexpf(1.0f, 16 - e);
    int32_t sums[2][SLICES] = {{0}};
    for (int i = 0; i < 32; ++i) {
        int32_t a[SLICES];
        digits(finite ? (int32_t)nearbyintf(x[i] * inv) : 0, &a[0], &a[1], &a[2]);
        for (int k = 0; k < SLICES; ++k) {
            o->a[k][i] = (int8_t)a[k];
            sums[i / 16][k] += a[k];
        }
    }
    slice_sums(o, e, finite, sums);
}
#endif

/* rows of x (in floats each, x_stride apart) -> xs (rows, in / 32) */
static void slice_rows(const float *x, int64_t rows, int64_t in, int64_t x_stride, xblk_t *xs) {
    const int64_t nb = in / 32;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < nb; ++b) slice_block(x + r * x_stride + 32 * b, xs + r * nb + b);
}

/* ---------------------------------------------------------------- the products
 * Per block (or K-quant sub-block) of a group: the slices' exact sums, then the float32 terms, in
 * one order: for each block in turn, y = fma(scale, value, y) (and a min's term after it). */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define INT_SIMD "avx512-vnni"
typedef __m512i ivec;
typedef __m512 fvec;
typedef __m512i wvec;  /* a register of weight bytes */
static inline __attribute__((always_inline)) void planes(int64_t t, const uint8_t *g, wvec *w) {
    if (t == I8_0) {
        for (int J = 0; J < 8; ++J) w[J] = _mm512_loadu_si512(g + 64 * J);
        return;
    }
    if (t == I2_K || t == I3_K) {  /* two bits a weight in two planes, then Q3_K's third as masks */
        const __m512i three = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
        for (int p = 0; p < 2; ++p) {
            const __m512i v = _mm512_loadu_si512(g + 64 * p);
            for (int m = 0; m < 4; ++m) w[4 * p + m] = _mm512_and_si512(_mm512_srli_epi16(v, 2 * m), three);
        }
        if (t == I3_K)
            for (int J = 0; J < 8; ++J) {
                uint64_t bits;
                memcpy(&bits, g + 128 + 8 * J, 8);
                w[J] = _mm512_mask_add_epi8(w[J], _cvtu64_mask64(bits), w[J], four);
            }
        return;
    }
    const __m512i f = _mm512_set1_epi8(0xf);
    for (int J = 0; J < 4; ++J) {
        const __m512i v = _mm512_loadu_si512(g + 64 * J);
        w[J] = _mm512_and_si512(v, f);
        w[J + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), f);
    }
    if (has_q5(t)) {
        const __m512i sixteen = _mm512_set1_epi8(16);
        for (int J = 0; J < 8; ++J) {
            uint64_t bits;
            memcpy(&bits, g + 256 + 8 * J, 8);
            w[J] = _mm512_mask_add_epi8(w[J], _cvtu64_mask64(bits), w[J], sixteen);
        }
    } else if (t == I6_K) {
        const __m512i three = _mm512_set1_epi8(3);
        for (int p = 0; p < 2; ++p) {
            const __m512i v = _mm512_loadu_si512(g + 256 + 64 * p);
            for (int m = 0; m < 4; ++m)
                w[4 * p + m] = _mm512_or_si512(w[4 * p + m],
                    _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(v, 2 * m), three), 4));
        }
    } else if (is_iq4(t)) {  /* each index to its value + 128: a byte shuffle within each 16-byte lane */
        const __m512i values = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)IQ4_STORED));
        for (int J = 0; J < 8; ++J) w[J] = _mm512_shuffle_epi8(values, w[J]);
    }
}
/* Each slice's sums over inputs 0-15 (u) and 16-31 (v), exact. */
typedef int32_t __attribute__((may_alias, aligned(4))) slice4_t;  /* four slice bytes, read as one */
static inline __attribute__((always_inline)) void slice_dots(const wvec *w, const xblk_t *xb, ivec *u, ivec *v) {
    for (int k = 0; k < SLICES; ++k) {
        const slice4_t *a = (const slice4_t *)xb->a[k];  /* each broadcast to 16 lanes, in the vpdpbusd */
        __m512i s = _mm512_setzero_si512(), t = s;
        for (int J = 0; J < 4; ++J) {
            s = _mm512_dpbusd_epi32(s, w[J], _mm512_set1_epi32(a[J]));
            t = _mm512_dpbusd_epi32(t, w[J + 4], _mm512_set1_epi32(a[J + 4]));
        }
        u[k] = s;
        v[k] = t;
    }
}
#define IADD _mm512_add_epi32
#define ISUB _mm512_sub_epi32
#define ISET _mm512_set1_epi32
#define FSET _mm512_set1_ps
#define FMUL _mm512_mul_ps
#define FMA _mm512_fmadd_ps
#define FNMA _mm512_fnmadd_ps
#define TOF _mm512_cvtepi32_ps
#define IMUL _mm512_mullo_epi32
static inline ivec IPAIR(ivec a, ivec b) { return _mm512_add_epi32(_mm512_slli_epi32(a, 8), b); }
static inline fvec f16x16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline fvec u8x16f(const uint8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p))); }
static inline fvec s8x16f(const uint8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))); }
static inline ivec u8x16i(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline ivec ILOW4(ivec a) { return _mm512_and_si512(a, _mm512_set1_epi32(15)); }
static inline ivec IHIGH4(ivec a) { return _mm512_srli_epi32(a, 4); }
#else
/* Plain C: 16 lanes in arrays, the same integers, the same float32 operations lane by lane. */
#define INT_SIMD "portable C"
typedef struct { int32_t l[16]; } ivec;
typedef struct { float l[16]; } fvec;
typedef struct { uint8_t b[64]; } wvec;
static inline ivec IADD(ivec a, ivec b) { for (int i = 0; i < 16; ++i) a.l[i] += b.l[i]; return a; }
static inline ivec ISUB(ivec a, ivec b) { for (int i = 0; i < 16; ++i) a.l[i] -= b.l[i]; return a; }
static inline ivec ISET(int32_t v) { ivec a; for (int i = 0; i < 16; ++i) a.l[i] = v; return a; }
static inline ivec IPAIR(ivec a, ivec b) { for (int i = 0; i < 16; ++i) a.l[i] = a.l[i] * 256 + b.l[i]; return a; }
static inline ivec IMUL(ivec a, ivec b) { for (int i = 0; i < 16; ++i) a.l[i] *= b.l[i]; return a; }
static inline ivec u8x16i(const uint8_t *p) { ivec a; for (int i = 0; i < 16; ++i) a.l[i] = p[i]; return a; }
static inline ivec ILOW4(ivec a) { for (int i = 0; i < 16; ++i) a.l[i] &= 15; return a; }
static inline ivec IHIGH4(ivec a) { for (int i = 0; i < 16; ++i) a.l[i] >>= 4; return a; }
static inline fvec FSET(float v) { fvec a; for (int i = 0; i < 16; ++i) a.l[i] = v; return a; }
static inline fvec FMUL(fvec a, fvec b) { for (int i = 0; i < 16; ++i) a.l[i] *= b.l[i]; return a; }
static inline fvec FMA(fvec a, fvec b, fvec c) { for (int i = 0; i < 16; ++i) c.l[i] = fmaf(a.l[i], b.l[i], c.l[i]); return c; }
static inline fvec FNMA(fvec a, fvec b, fvec c) { for (int i = 0; i < 16; ++i) c.l[i] = fmaf(-a.l[i], b.l[i], c.l[i]); return c; }
static inline fvec TOF(ivec a) { fvec f; for (int i = 0; i < 16; ++i) f.l[i] = (float)a.l[i]; return f; }
static inline fvec f16x16(const uint8_t *p) { fvec f; for (int i = 0; i < 16; ++i) f.l[i] = f16(p + 2 * i); return f; }
static inline fvec u8x16f(const uint8_t *p) { fvec f; for (int i = 0; i < 16; ++i) f.l[i] = (float)p[i]; return f; }
static inline fvec s8x16f(const uint8_t *p) { fvec f; for (int i = 0; i < 16; ++i) f.l[i] = (float)(int8_t)p[i]; return f; }
/* These two are not inlined: copied into each type's and tile's loop they doubled the build's time. */
static __attribute__((noinline)) void planes(int64_t t, const uint8_t *g, wvec *w) {
    for (int J = 0; J < 8; ++J)
        for (int r = 0; r < 16; ++r)
            for (int k = 0; k < 4; ++k) w[J].b[4 * r + k] = (uint8_t)plane_q(t, g, r, 4 * J + k);
}
static __attribute__((noinline)) void slice_dots(const wvec *w, const xblk_t *xb, ivec *u, ivec *v) {
    for (int k = 0; k < SLICES; ++k)
        for (int r = 0; r < 16; ++r) {
            int32_t s = 0, t = 0;
            for (int J = 0; J < 4; ++J)
                for (int c = 0; c < 4; ++c) {
                    s += w[J].b[4 * r + c] * xb->a[k][4 * J + c];
                    t += w[J + 4].b[4 * r + c] * xb->a[k][16 + 4 * J + c];
                }
            u[k].l[r] = s;
            v[k].l[r] = t;
        }
}
#endif

/* The block's value in units of s 2^-16 from its slices' sums (less `off` times the activations'
 * own where the weights are stored as q + off): 2^8 hi + lo, rounded once. */
static inline __attribute__((always_inline)) fvec value(const ivec *s, int32_t off_hi, int32_t off_lo) {
    const ivec hi = ISUB(IPAIR(s[0], s[1]), ISET(off_hi)), lo = ISUB(s[2], ISET(off_lo));
    return FMA(TOF(hi), FSET(256.0f), TOF(lo));
}

/* Block b's terms for one activation row, added to y: the types' formulas. */
static inline __attribute__((always_inline)) fvec legacy_terms(int64_t t, const wvec *w, const uint8_t *sc, const xblk_t *xb, fvec y) {
    ivec u[SLICES], v[SLICES], s[SLICES];
    slice_dots(w, xb, u, v);
    for (int k = 0; k < SLICES; ++k) s[k] = IADD(u[k], v[k]);
    const int off = int_offset(t);
    y = FMA(FMUL(f16x16(sc), FSET(xb->unit)), value(s, off * (xb->hi[0] + xb->hi[1]), off * (xb->lo[0] + xb->lo[1])), y);
    return has_min(t) ? FMA(f16x16(sc + 32), FSET(xb->sx), y) : y;
}

/* fma(float(hi), 2^8, float(lo)) of two halves' sums each times its own integer (a Q2_K scale or
 * min): sc0 (2^8 hi0 + lo0) + sc1 (2^8 hi1 + lo1), the products and sums in int32. */
static inline __attribute__((always_inline)) fvec scaled_pair(ivec sc0, ivec sc1, ivec hi0, ivec lo0, ivec hi1, ivec lo1) {
    const ivec hi = IADD(IMUL(sc0, hi0), IMUL(sc1, hi1)), lo = IADD(IMUL(sc0, lo0), IMUL(sc1, lo1));
    return FMA(TOF(hi), FSET(256.0f), TOF(lo));
}

/* Sub-block s (32 inputs) of a K-type's 256 for one activation row. */
static inline __attribute__((always_inline)) fvec k_terms(int64_t t, const wvec *w, const uint8_t *g, int s, const xblk_t *xb, fvec y) {
    ivec u[SLICES], v[SLICES];
    slice_dots(w, xb, u, v);
    const fvec d = f16x16(g), unit = FSET(xb->unit);
    const int off = int_offset(t);
    if (t == I6_K || t == I3_K) {  /* a signed scale for each half (16 inputs), q - off in each */
        y = FMA(FMUL(FMUL(d, s8x16f(g + 32 + 16 * (2 * s))), unit), value(u, off * xb->hi[0], off * xb->lo[0]), y);
        return FMA(FMUL(FMUL(d, s8x16f(g + 32 + 16 * (2 * s + 1))), unit), value(v, off * xb->hi[1], off * xb->lo[1]), y);
    }
    if (t == I2_K) {  /* each half's 4-bit scale and min applied in integers: two terms, as Q4_K's */
        const ivec b0 = u8x16i(g + 64 + 16 * (2 * s)), b1 = u8x16i(g + 64 + 16 * (2 * s + 1));
        y = FMA(FMUL(d, unit), scaled_pair(ILOW4(b0), ILOW4(b1), IPAIR(u[0], u[1]), u[2],
                                           IPAIR(v[0], v[1]), v[2]), y);
        return FNMA(FMUL(f16x16(g + 32), unit), scaled_pair(IHIGH4(b0), IHIGH4(b1), ISET(xb->hi[0]), ISET(xb->lo[0]),
                                                            ISET(xb->hi[1]), ISET(xb->lo[1])), y);
    }
    ivec q[SLICES];
    for (int k = 0; k < SLICES; ++k) q[k] = IADD(u[k], v[k]);
    if (t == IX_S)  /* a signed scale for the 32, the values stored + 128 */
        return FMA(FMUL(FMUL(d, s8x16f(g + 32 + 16 * s)), unit),
                   value(q, off * (xb->hi[0] + xb->hi[1]), off * (xb->lo[0] + xb->lo[1])), y);
    y = FMA(FMUL(FMUL(d, u8x16f(g + 64 + 16 * s)), unit), value(q, 0, 0), y);
    return FNMA(FMUL(f16x16(g + 32), u8x16f(g + 192 + 16 * s)), FSET(xb->sx), y);
}

/* Activation rows r0 .. r0 + n - 1 (n <= TILE) against one group (16 rows) of a repacked part,
 * each block's planes unpacked once for the n; lanes l0 .. l1 - 1 stored, row r's at
 * y[r * y_stride + lane - l0]. Inlined with t and n constant: one loop per type and count. */
enum { TILE = 4 };
static inline __attribute__((always_inline)) void tile_of(const int64_t t, const int n, const uint8_t *grp,
                                                          int64_t in, const xblk_t *xs, float *y, int64_t y_stride,
                                                          int l0, int l1) {
    const int64_t nb = in / 32, bb = int_block_bytes(t);
    fvec acc[TILE];
    for (int r = 0; r < n; ++r) acc[r] = FSET(0.0f);
    if (!is_k(t)) {
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t *g = grp + b * bb;
            wvec w[8];
            planes(t, g, w);
            const uint8_t *sc = g + bb - (has_min(t) ? 64 : 32);
            for (int r = 0; r < n; ++r) acc[r] = legacy_terms(t, w, sc, xs + r * nb + b, acc[r]);
        }
    } else {
        for (int64_t b = 0; b < nb / 8; ++b) {
            const uint8_t *g = grp + b * bb;
            for (int s = 0; s < 8; ++s) {
                wvec w[8];
                planes(t, g + k_head(t) + s * k_plane(t), w);
                for (int r = 0; r < n; ++r) acc[r] = k_terms(t, w, g, s, xs + r * nb + 8 * b + s, acc[r]);
            }
        }
    }
    for (int r = 0; r < n; ++r) {
        float out[16];
        memcpy(out, &acc[r], sizeof out);
        memcpy(y + r * y_stride, out + l0, sizeof(float) * (l1 - l0));
    }
}

/* One group against R activation rows (xs: their blocks, in / 32 a row): tiles of TILE rows. */
static inline __attribute__((always_inline)) void group_of(const int64_t t, const uint8_t *grp, int64_t in,
                                                           const xblk_t *xs, int64_t R, float *y,
                                                           int64_t y_stride, int l0, int l1) {
    const int64_t nb = in / 32;
    for (int64_t r0 = 0; r0 < R; r0 += TILE) {
        const xblk_t *x = xs + r0 * nb;
        float *yr = y + r0 * y_stride;
        switch (R - r0 < TILE ? R - r0 : TILE) {
        case 1: tile_of(t, 1, grp, in, x, yr, y_stride, l0, l1); break;
        case 2: tile_of(t, 2, grp, in, x, yr, y_stride, l0, l1); break;
        case 3: tile_of(t, 3, grp, in, x, yr, y_stride, l0, l1); break;
        default: tile_of(t, TILE, grp, in, x, yr, y_stride, l0, l1); break;
        }
    }
}

/* group_of for each type apart: the compiler makes each its own loop, with no test of the type in it. */
static void int_group(int64_t t, const uint8_t *grp, int64_t in, const xblk_t *xs, int64_t R, float *y,
                      int64_t y_stride, int l0, int l1) {
    switch (t) {
#define ONE(T) case T: group_of(T, grp, in, xs, R, y, y_stride, l0, l1); break;
    ONE(I4_0) ONE(I4_1) ONE(I5_0) ONE(I5_1) ONE(I8_0) ONE(IN_L)
    ONE(I2_K) ONE(I3_K) ONE(I4_K) ONE(I5_K) ONE(I6_K) ONE(IX_S)
#undef ONE
    default: abort();
    }
}

/* Rows [o0, o1) of a repacked part (its own numbering) for R activation rows: Y[r, o] at
 * y[r * y_stride + o - o0]. A range that cuts a group computes the group and keeps its rows.
 * The groups are read in order, one stream the hardware's prefetcher follows: asking for the whole
 * next group at each group's start (5-11 KiB, 90-170 lines at once) stalled the loads behind it,
 * and without it decoding ran 1.37x (SmolLM2) and 1.36x (Gemma 3 270M) as fast on this AMD EPYC;
 * asking for each block's lines 4 KiB ahead as it is read gained nothing over none. */
static void int_rows(int64_t t, const uint8_t *data, int64_t group_bytes, int64_t in, const xblk_t *xs,
                     int64_t R, float *y, int64_t y_stride, int64_t o0, int64_t o1) {
    for (int64_t g0 = o0 / GROUP * GROUP; g0 < o1; g0 += GROUP) {
        const uint8_t *grp = data + (g0 / GROUP) * group_bytes;
        const int l0 = o0 > g0 ? (int)(o0 - g0) : 0, l1 = o1 - g0 < GROUP ? (int)(o1 - g0) : GROUP;
        int_group(t, grp, in, xs, R, y + (g0 + l0 - o0), y_stride, l0, l1);
    }
}

/* Which integer kernels this build has: "avx512-vnni", or "portable C" (the same bits, slower). */
const char *token_lab_int_simd(void) { return INT_SIMD; }
