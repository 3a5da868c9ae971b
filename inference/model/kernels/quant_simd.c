/* The float32 products' fused decoders, AVX2 and AVX-512 (included by kernels.c, after quant.c). */
/* ---------------------------------------------------------------- fused: AVX2's lanes
 * Where the CPU has AVX2, a row's blocks are dequantized 32 weights at a time into four 8-lane
 * registers (the same float32 operations as above, lane by lane) and summed at once, in dot()'s
 * order (four accumulators over chunks of 32, added as (a + b) + (c + d) and across lanes):
 * quantized rows are whole chunks of 32, so that is all of dot()'s order there is. Elsewhere
 * the row goes through a buffer (dequant_row, then dot): the same numbers. */
/* One quantized row against one or two rows of activations; against four (x_stride floats apart,
 * sums y_stride apart). */
typedef void (*qdot_fn)(const uint8_t *, const float *, const float *, int64_t, float *, float *);
typedef void (*qdot4_fn)(const uint8_t *, const float *, int64_t, int64_t, float *, int64_t);
#if defined(__AVX2__)
#include <immintrin.h>

/* 8 bytes -> 8 int32 lanes */
static inline __m256i u8x8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline v8 to_v8(__m256 v) { v8 r; memcpy(&r, &v, sizeof r); return r; }
static inline v8 ints(__m256i q) { return to_v8(_mm256_cvtepi32_ps(q)); }

/* Chunk c (of 32 weights) of a block into w[4]; each decoder as its row_* above. */
static inline void dec_q8_0(const uint8_t *b, int c, v8 *w) {
    (void)c;
    const float d = f16(b);
    for (int k = 0; k < 4; ++k)
        w[k] = to_v8(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * k))))) * d;
}

/* the 32 nibbles of 16 bytes, lanes in gguf's order: low nibbles of bytes 0-15, then high */
static inline void nibbles(const uint8_t *q, __m256i *n) {
    const __m256i f = _mm256_set1_epi32(0xf);
    const __m256i a = u8x8(q), b = u8x8(q + 8);
    n[0] = _mm256_and_si256(a, f);
    n[1] = _mm256_and_si256(b, f);
    n[2] = _mm256_srli_epi32(a, 4);
    n[3] = _mm256_srli_epi32(b, 4);
}

static inline void dec_q4_0(const uint8_t *b, int c, v8 *w) {
    (void)c;
    const float d = f16(b);
    __m256i n[4];
    nibbles(b + 2, n);
    for (int k = 0; k < 4; ++k) w[k] = d * ints(_mm256_sub_epi32(n[k], _mm256_set1_epi32(8)));
}

static inline void dec_q4_1(const uint8_t *b, int c, v8 *w) {
    (void)c;
    const float d = f16(b), m = f16(b + 2);
    __m256i n[4];
    nibbles(b + 4, n);
    for (int k = 0; k < 4; ++k) w[k] = d * ints(n[k]) + m;
}

static inline void dec_q5_0(const uint8_t *b, int c, v8 *w) {
    (void)c;
    const float d = f16(b);
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    __m256i n[4];
    nibbles(b + 6, n);
    const __m256i h = _mm256_set1_epi32((int)qh), one = _mm256_set1_epi32(1);
    for (int k = 0; k < 4; ++k) {
        const __m256i lane = _mm256_setr_epi32(8 * k, 8 * k + 1, 8 * k + 2, 8 * k + 3, 8 * k + 4, 8 * k + 5,
                                               8 * k + 6, 8 * k + 7);
        const __m256i hi = _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(h, lane), one), 4);
        w[k] = d * ints(_mm256_sub_epi32(_mm256_or_si256(n[k], hi), _mm256_set1_epi32(16)));
    }
}

static inline void dec_q4_k(const uint8_t *b, int c, v8 *w) {
    uint8_t sc, m;
    scale_min_k4(b + 4, c, &sc, &m);
    const float ds = f16(b) * (float)sc, dm = f16(b + 2) * (float)m;
    const uint8_t *qs = b + 16 + (c / 2) * 32;
    const __m256i f = _mm256_set1_epi32(0xf);
    for (int k = 0; k < 4; ++k)
        w[k] = ds * ints(_mm256_and_si256(_mm256_srli_epi32(u8x8(qs + 8 * k), 4 * (c % 2)), f)) - dm;
}

/* Where chunk c (of 32 weights) of a Q6_K block keeps its bits: as row_q6_k reads them. */
typedef struct { const uint8_t *ql, *qh; int lo_shift, hi_shift; const int8_t *scales; float d; } q6k_chunk_t;
static inline q6k_chunk_t q6k_chunk(const uint8_t *b, int c) {
    const int h = c / 4, k4 = c % 4;
    return (q6k_chunk_t){b + h * 64 + (k4 % 2) * 32, b + 128 + h * 32, 4 * (k4 / 2), 2 * k4,
                         (const int8_t *)(b + 192) + c * 2, f16(b + 208)};
}

static inline void dec_q6_k(const uint8_t *b, int c, v8 *w) {
    const q6k_chunk_t q6 = q6k_chunk(b, c);
    const __m256i f = _mm256_set1_epi32(0xf), three = _mm256_set1_epi32(3);
    for (int k = 0; k < 4; ++k) {
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi32(u8x8(q6.ql + 8 * k), q6.lo_shift), f);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi32(u8x8(q6.qh + 8 * k), q6.hi_shift), three);
        const __m256i q = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
        w[k] = (q6.d * (float)q6.scales[k / 2]) * ints(q);
    }
}

static inline void dec_bf16(const uint8_t *b, int c, v8 *w) {
    (void)c;
    for (int k = 0; k < 4; ++k) {
        const __m256i q = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 16 * k))), 16);
        w[k] = to_v8(_mm256_castsi256_ps(q));
    }
}

/* One quantized row (n weights) against x0 and, unless NULL, x1: dot()'s order for each. */
#define QDOT(NAME, BLOCK_BYTES, CHUNKS, DECODE)                                                     \
    static __attribute__((unused)) void NAME(const uint8_t *row, const float *x0, const float *x1, int64_t n, float *s0, float *s1) { \
        v8 a = {0}, b = {0}, c = {0}, d = {0}, e = {0}, f = {0}, g = {0}, h = {0};                     \
        int64_t i = 0;                                                                                 \
        for (const uint8_t *blk = row; i < n; blk += BLOCK_BYTES)                                      \
            for (int ch = 0; ch < CHUNKS; ++ch, i += 32) {                                             \
                v8 w[4];                                                                               \
                DECODE(blk, ch, w);                                                                    \
                a = fma8(w[0], load8(x0 + i), a); b = fma8(w[1], load8(x0 + i + 8), b);                \
                c = fma8(w[2], load8(x0 + i + 16), c); d = fma8(w[3], load8(x0 + i + 24), d);          \
                if (x1) {                                                                              \
                    e = fma8(w[0], load8(x1 + i), e); f = fma8(w[1], load8(x1 + i + 8), f);            \
                    g = fma8(w[2], load8(x1 + i + 16), g); h = fma8(w[3], load8(x1 + i + 24), h);      \
                }                                                                                      \
            }                                                                                          \
        *s0 = sum8((a + b) + (c + d));                                                                 \
        if (x1) *s1 = sum8((e + f) + (g + h));                                                         \
    }
QDOT(qdot_q8_0, 34, 1, dec_q8_0)
QDOT(qdot_q4_0, 18, 1, dec_q4_0)
QDOT(qdot_q4_1, 20, 1, dec_q4_1)
QDOT(qdot_q5_0, 22, 1, dec_q5_0)
QDOT(qdot_q4_k, 144, 8, dec_q4_k)
QDOT(qdot_q6_k, 210, 8, dec_q6_k)
QDOT(qdot_bf16, 64, 1, dec_bf16)


#if defined(__AVX512F__)
/* With AVX-512 the 32-weight blocks take two 16-lane registers: lanes 0-15 hold what dot()'s a and
 * b hold, lanes 16-31 its c and d, each lane the same multiply-adds, so the sums are the same bits
 * (the halves are split back for (a + b) + (c + d)). */
static inline __m512 splat(float v) { return _mm512_set1_ps(v); }
static inline __m512 ints16(__m512i q) { return _mm512_cvtepi32_ps(q); }
static inline __m512i u8x16(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }

static inline void dec16_q8_0(const uint8_t *b, int c, __m512 *w) {
    (void)c;
    const __m512 d = splat(f16(b));
    for (int k = 0; k < 2; ++k)
        w[k] = _mm512_mul_ps(ints16(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2 + 16 * k)))), d);
}
/* A 4-bit block has 16 possible weights: the block's table of them (t[q], computed as the row_*
 * functions compute each weight, so the same bits) is one register, and each weight is a lane
 * of it picked by its nibble (a permute reads only an index's low 4 bits: the low nibble needs
 * no mask). Two permutes take the place of a mask, two conversions and two multiplies and adds
 * a block: on an Intel Xeon with AVX-512, SmolLM2's Q4_1 products 12-14% faster. */
static inline __m512 nibble_values(void) {
    return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
static inline void pick16(__m512 t, const uint8_t *q, __m512 *w) {
    const __m512i n = u8x16(q);
    w[0] = _mm512_permutexvar_ps(n, t);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(n, 4), t);
}
static inline void dec16_q4_0(const uint8_t *b, int c, __m512 *w) {
    (void)c;
    pick16(_mm512_mul_ps(splat(f16(b)), _mm512_sub_ps(nibble_values(), splat(8.0f))), b + 2, w);
}
static inline void dec16_q4_1(const uint8_t *b, int c, __m512 *w) {
    (void)c;
    pick16(_mm512_add_ps(_mm512_mul_ps(splat(f16(b)), nibble_values()), splat(f16(b + 2))), b + 4, w);
}
static inline void dec16_q5_0(const uint8_t *b, int c, __m512 *w) {
    (void)c;
    const __m512 d = splat(f16(b));
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    const __m512i q = u8x16(b + 6), h = _mm512_set1_epi32((int)qh), one = _mm512_set1_epi32(1);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i n[2] = {_mm512_and_si512(q, _mm512_set1_epi32(0xf)), _mm512_srli_epi32(q, 4)};
    for (int k = 0; k < 2; ++k) {
        const __m512i shift = _mm512_add_epi32(lane, _mm512_set1_epi32(16 * k));
        const __m512i hi = _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(h, shift), one), 4);
        w[k] = _mm512_mul_ps(d, ints16(_mm512_sub_epi32(_mm512_or_si512(n[k], hi), _mm512_set1_epi32(16))));
    }
}

static inline void dec16_bf16(const uint8_t *b, int c, __m512 *w) {
    (void)c;
    for (int k = 0; k < 2; ++k)
        w[k] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(b + 32 * k))), 16));
}

/* A K-quant's chunk c (of 32 weights) of its 256-weight block: as dec_q4_k and dec_q6_k, 16 lanes
 * at a time (Q6_K's scale changes every 16 weights: one a register). */
static inline void dec16_q4_k(const uint8_t *b, int c, __m512 *w) {
    uint8_t sc, m;
    scale_min_k4(b + 4, c, &sc, &m);
    const __m512 ds = splat(f16(b) * (float)sc), dm = splat(f16(b + 2) * (float)m);
    const uint8_t *qs = b + 16 + (c / 2) * 32;
    const __m512i f = _mm512_set1_epi32(0xf);
    for (int k = 0; k < 2; ++k)
        w[k] = _mm512_sub_ps(_mm512_mul_ps(ds, ints16(_mm512_and_si512(_mm512_srli_epi32(u8x16(qs + 16 * k), 4 * (c % 2)), f))), dm);
}
static inline void dec16_q6_k(const uint8_t *b, int c, __m512 *w) {
    const q6k_chunk_t q6 = q6k_chunk(b, c);
    const __m512i f = _mm512_set1_epi32(0xf), three = _mm512_set1_epi32(3);
    for (int k = 0; k < 2; ++k) {
        const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(u8x16(q6.ql + 16 * k), q6.lo_shift), f);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(u8x16(q6.qh + 16 * k), q6.hi_shift), three);
        const __m512i q = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), _mm512_set1_epi32(32));
        w[k] = _mm512_mul_ps(splat(q6.d * (float)q6.scales[k]), ints16(q));
    }
}

static inline float halves_sum(__m512 ab, __m512 cd) {
    const v8 a = to_v8(_mm512_castps512_ps256(ab)), c = to_v8(_mm512_castps512_ps256(cd));
    const v8 b = to_v8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(ab), 1)));
    const v8 d = to_v8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(cd), 1)));
    return sum8((a + b) + (c + d));
}

/* A block of BLOCK_BYTES holds CHUNKS chunks of 32 weights (one, or a K-quant's eight). */
#define QDOT16(NAME, BLOCK_BYTES, CHUNKS, DECODE)                                                   \
    static __attribute__((unused)) void NAME(const uint8_t *row, const float *x0, const float *x1, int64_t n, float *s0, float *s1) { \
        __m512 ab = _mm512_setzero_ps(), cd = ab, ef = ab, gh = ab;                                    \
        int64_t i = 0;                                                                                 \
        for (const uint8_t *blk = row; i < n; blk += BLOCK_BYTES)                                      \
            for (int ch = 0; ch < CHUNKS; ++ch, i += 32) {                                             \
                __m512 w[2];                                                                           \
                DECODE(blk, ch, w);                                                                    \
                ab = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(x0 + i), ab);                               \
                cd = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(x0 + i + 16), cd);                          \
                if (x1) {                                                                              \
                    ef = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(x1 + i), ef);                           \
                    gh = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(x1 + i + 16), gh);                      \
                }                                                                                      \
            }                                                                                          \
        *s0 = halves_sum(ab, cd);                                                                      \
        if (x1) *s1 = halves_sum(ef, gh);                                                              \
    }
QDOT16(qdot16_q8_0, 34, 1, dec16_q8_0)
QDOT16(qdot16_q4_0, 18, 1, dec16_q4_0)
QDOT16(qdot16_q4_1, 20, 1, dec16_q4_1)
QDOT16(qdot16_q5_0, 22, 1, dec16_q5_0)
QDOT16(qdot16_bf16, 64, 1, dec16_bf16)
QDOT16(qdot16_q4_k, 144, 8, dec16_q4_k)
QDOT16(qdot16_q6_k, 210, 8, dec16_q6_k)

/* Four rows of activations (x_stride floats apart) against one quantized row, each block
 * decoded once for the four (a step of several runs decodes it half as often as in pairs): each
 * row's sums as QDOT16's, so the same bits as alone. y: the four sums, y_stride apart. */
#define QDOT16X4(NAME, BLOCK_BYTES, CHUNKS, DECODE)                                                 \
    static void NAME(const uint8_t *row, const float *x, int64_t x_stride, int64_t n, float *y, int64_t y_stride) { \
        __m512 acc[8];                                                                                 \
        for (int k = 0; k < 8; ++k) acc[k] = _mm512_setzero_ps();                                      \
        int64_t i = 0;                                                                                 \
        for (const uint8_t *blk = row; i < n; blk += BLOCK_BYTES)                                      \
            for (int ch = 0; ch < CHUNKS; ++ch, i += 32) {                                             \
                __m512 w[2];                                                                           \
                DECODE(blk, ch, w);                                                                    \
                for (int r = 0; r < 4; ++r) {                                                          \
                    acc[2 * r] = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(x + r * x_stride + i), acc[2 * r]); \
                    acc[2 * r + 1] = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(x + r * x_stride + i + 16), acc[2 * r + 1]); \
                }                                                                                      \
            }                                                                                          \
        for (int r = 0; r < 4; ++r) y[r * y_stride] = halves_sum(acc[2 * r], acc[2 * r + 1]);         \
    }
QDOT16X4(qdot4_q8_0, 34, 1, dec16_q8_0)
QDOT16X4(qdot4_q4_0, 18, 1, dec16_q4_0)
QDOT16X4(qdot4_q4_1, 20, 1, dec16_q4_1)
QDOT16X4(qdot4_q5_0, 22, 1, dec16_q5_0)
QDOT16X4(qdot4_bf16, 64, 1, dec16_bf16)
QDOT16X4(qdot4_q4_k, 144, 8, dec16_q4_k)
QDOT16X4(qdot4_q6_k, 210, 8, dec16_q6_k)

static qdot4_fn fused4(int64_t type) {
    switch (type) {
    case GGML_Q8_0: return qdot4_q8_0;
    case GGML_Q4_0: return qdot4_q4_0;
    case GGML_Q4_1: return qdot4_q4_1;
    case GGML_Q5_0: return qdot4_q5_0;
    case GGML_BF16: return qdot4_bf16;
    case GGML_Q4_K: return qdot4_q4_k;
    case GGML_Q6_K: return qdot4_q6_k;
    default: return NULL;
    }
}
#else
static qdot4_fn fused4(int64_t type) { (void)type; return NULL; }
#endif

static qdot_fn fused(int64_t type) {
    switch (type) {
#if defined(__AVX512F__)
    case GGML_Q8_0: return qdot16_q8_0;
    case GGML_Q4_0: return qdot16_q4_0;
    case GGML_Q4_1: return qdot16_q4_1;
    case GGML_Q5_0: return qdot16_q5_0;
    case GGML_BF16: return qdot16_bf16;
    case GGML_Q4_K: return qdot16_q4_k;
    case GGML_Q6_K: return qdot16_q6_k;
#else
    case GGML_Q8_0: return qdot_q8_0;
    case GGML_Q4_0: return qdot_q4_0;
    case GGML_Q4_1: return qdot_q4_1;
    case GGML_Q5_0: return qdot_q5_0;
    case GGML_BF16: return qdot_bf16;
    case GGML_Q4_K: return qdot_q4_k;
    case GGML_Q6_K: return qdot_q6_k;
#endif
    default: return NULL;
    }
}
#else
static qdot_fn fused(int64_t type) { (void)type; return NULL; }
static qdot4_fn fused4(int64_t type) { (void)type; return NULL; }
#endif
