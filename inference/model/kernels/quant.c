/* Weights in a GGUF file's own blocks (loaded with kernels.c, which includes this file).
 *
 * A weight is described by an int64 table (quant.py's QuantWeight.desc): out, in, n_parts, then
 * per part: ggml type, rows, data address, bytes per row. Parts stack their rows in order (a
 * fused q/k/v weight whose v rows are Q8_0 and q/k rows Q5_0 is three parts). Type 0 (F32) is a
 * float32 row-major matrix: kernels.c's products read it as they always did.
 *
 * A quantized row is dequantized into a float32 buffer the size of one row (in L1), exactly as
 * gguf's own dequantize computes it (the same float32 operations in the same order: with
 * -ffp-contract=off no multiply-add is fused), and then summed by dot()/dot2() in their one
 * order. So a product on the blocks gives the same numbers as the float32 product on the
 * dequantized matrix, and a row's the same alone or beside others. */

enum { GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
       GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_IQ4_NL = 20,
       GGML_IQ4_XS = 23, GGML_BF16 = 30 };
enum { W_OUT, W_IN, W_PARTS, W_FIRST };  /* then per part: */
enum { P_TYPE, P_ROWS, P_DATA, P_ROW_BYTES, PART_FIELDS };

static float f16_table[65536];
static int int_dequant_row(int64_t type, const uint8_t *data, int64_t stride, int64_t row, float *y, int64_t n);  /* islices.c */

static float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {  /* subnormal: normalise */
        int e = -1;
        uint32_t m = man;
        do { ++e; m <<= 1; } while (!(m & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((m & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

__attribute__((constructor)) static void fill_f16_table(void) {
    for (uint32_t i = 0; i < 65536; ++i) f16_table[i] = half_to_float((uint16_t)i);
}

static inline float f16(const uint8_t *p) { return f16_table[p[0] | (p[1] << 8)]; }

/* ---------------------------------------------------------------- one row, dequantized
 * Each as gguf.quants' dequantize_blocks: the operations' order is that file's. */
static void row_q8_0(const uint8_t *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 32, b += 34) {
        const float d = f16(b);
        const int8_t *q = (const int8_t *)(b + 2);
        for (int j = 0; j < 32; ++j) y[i + j] = (float)q[j] * d;
    }
}

static void row_q4_0(const uint8_t *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 32, b += 18) {
        const float d = f16(b);
        const uint8_t *q = b + 2;
        for (int j = 0; j < 16; ++j) {
            y[i + j] = d * (float)((int)(q[j] & 0xf) - 8);
            y[i + j + 16] = d * (float)((int)(q[j] >> 4) - 8);
        }
    }
}

static void row_q4_1(const uint8_t *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 32, b += 20) {
        const float d = f16(b), m = f16(b + 2);
        const uint8_t *q = b + 4;
        for (int j = 0; j < 16; ++j) {
            y[i + j] = d * (float)(q[j] & 0xf) + m;
            y[i + j + 16] = d * (float)(q[j] >> 4) + m;
        }
    }
}

static void row_q5_0(const uint8_t *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 32, b += 22) {
        const float d = f16(b);
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        const uint8_t *q = b + 6;
        for (int j = 0; j < 16; ++j) {
            const int lo = (q[j] & 0xf) | (int)((qh >> j) & 1) << 4;
            const int hi = (q[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            y[i + j] = d * (float)(lo - 16);
            y[i + j + 16] = d * (float)(hi - 16);
        }
    }
}

/* Q5_1: d, m, the fifth bits, then the nibbles (24 bytes); d q + m. */
static void row_q5_1(const uint8_t *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 32, b += 24) {
        const float d = f16(b), m = f16(b + 2);
        uint32_t qh;
        memcpy(&qh, b + 4, 4);
        const uint8_t *q = b + 8;
        for (int j = 0; j < 16; ++j) {
            const int lo = (q[j] & 0xf) | (int)((qh >> j) & 1) << 4;
            const int hi = (q[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            y[i + j] = d * (float)lo + m;
            y[i + j + 16] = d * (float)hi + m;
        }
    }
}

/* IQ4_NL and IQ4_XS: each 4-bit index picks one of 16 non-linear int8 values. */
static const int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void row_iq4_nl(const uint8_t *b, float *y, int64_t n) {  /* d, then the nibbles (18 bytes) */
    for (int64_t i = 0; i < n; i += 32, b += 18) {
        const float d = f16(b);
        const uint8_t *q = b + 2;
        for (int j = 0; j < 16; ++j) {
            y[i + j] = d * (float)IQ4_VALUES[q[j] & 0xf];
            y[i + j + 16] = d * (float)IQ4_VALUES[q[j] >> 4];
        }
    }
}

/* Q4_K and Q5_K's eight 6-bit scales and mins, packed in 12 bytes. */
static inline void scale_min_k4(const uint8_t *s, int j, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K (144-byte blocks) and Q5_K (176: a fifth bit per weight in qh, 32 bytes before qs). */
static void row_k4(const uint8_t *b, float *y, int64_t n, int q5) {
    for (int64_t i = 0; i < n; i += 256, b += q5 ? 176 : 144) {
        const float d = f16(b), dmin = f16(b + 2);
        const uint8_t *scales = b + 4, *qh = b + 16, *q = b + (q5 ? 48 : 16);
        for (int s = 0; s < 8; ++s) {
            uint8_t sc, m;
            scale_min_k4(scales, s, &sc, &m);
            const float ds = d * (float)sc, dm = dmin * (float)m;
            const uint8_t *qs = q + (s / 2) * 32;
            const int shift = (s % 2) * 4;
            float *o = y + i + s * 32;
            for (int l = 0; l < 32; ++l)
                o[l] = ds * (float)(((qs[l] >> shift) & 0xf) | (q5 ? ((qh[l] >> s) & 1) << 4 : 0)) - dm;
        }
    }
}

static void row_q6_k(const uint8_t *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 256, b += 210) {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *scales = (const int8_t *)(b + 192);
        const float d = f16(b + 208);
        for (int e = 0; e < 256; ++e) {
            const int h = e / 128, k = (e % 128) / 32, l = e % 32;  /* half, quarter, lane */
            const int lo = (ql[h * 64 + (k % 2) * 32 + l] >> (4 * (k / 2))) & 0xf;
            const int hi = (qh[h * 32 + l] >> (2 * k)) & 3;
            y[i + e] = (d * (float)scales[e / 16]) * (float)((lo | hi << 4) - 32);
        }
    }
}

/* Q2_K (84 bytes): sixteen scale bytes (a scale in the low nibble, a min in the high one, each
 * for 16 weights), 2-bit weights, d, dmin; (d sc) q - dmin mn. */
static void row_q2_k(const uint8_t *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 256, b += 84) {
        const float d = f16(b + 80), dmin = f16(b + 82);
        for (int e = 0; e < 256; ++e) {
            const int h = e / 128, k = (e % 128) / 32, l = e % 32, sc = b[e / 16];  /* half, shift, lane */
            const float dl = d * (float)(sc & 0xf), ml = dmin * (float)(sc >> 4);
            y[i + e] = dl * (float)((b[16 + 32 * h + l] >> (2 * k)) & 3) - ml;
        }
    }
}

/* Q3_K's sixteen 6-bit signed scales (-32..31), packed in 12 bytes: low nibbles, then high pairs. */
static inline int scale_q3_k(const uint8_t *s, int j) {
    const int lo = (s[j % 8] >> (4 * (j / 8))) & 0xf, hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | hi << 4) - 32;
}

/* Q3_K (110 bytes): a high-bit mask, 2-bit weights, the scales, d; (d sc) (q - 4 (1 - bit)). */
static void row_q3_k(const uint8_t *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 256, b += 110) {
        const float d = f16(b + 108);
        for (int e = 0; e < 256; ++e) {
            const int h = e / 128, k = (e % 128) / 32, l = e % 32;
            const int q = ((b[32 + 32 * h + l] >> (2 * k)) & 3) - 4 * (((b[l] >> (e / 32)) & 1) ^ 1);
            y[i + e] = (d * (float)scale_q3_k(b + 96, e / 16)) * (float)q;
        }
    }
}

/* IQ4_XS's eight 6-bit signed scales (-32..31): low nibbles at 4..7, high pairs in the u16 at 2. */
static inline int scale_iq4_xs(const uint8_t *b, int s) {
    const int lo = (b[4 + s / 2] >> (4 * (s % 2))) & 0xf, hi = ((b[2] | b[3] << 8) >> (2 * s)) & 3;
    return (lo | hi << 4) - 32;
}

/* IQ4_XS (136 bytes): d, the scales, then per 32 weights 16 bytes of nibbles; (d sc) value. */
static void row_iq4_xs(const uint8_t *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 256, b += 136) {
        const float d = f16(b);
        for (int s = 0; s < 8; ++s) {
            const float dl = d * (float)scale_iq4_xs(b, s);
            const uint8_t *q = b + 8 + 16 * s;
            for (int j = 0; j < 16; ++j) {
                y[i + 32 * s + j] = dl * (float)IQ4_VALUES[q[j] & 0xf];
                y[i + 32 * s + j + 16] = dl * (float)IQ4_VALUES[q[j] >> 4];
            }
        }
    }
}

static void row_f16(const uint8_t *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = f16(b + 2 * i);
}

/* bfloat16: a float32's top 16 bits, exact */
static void row_bf16(const uint8_t *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = (uint32_t)(b[2 * i] | (b[2 * i + 1] << 8)) << 16;
        memcpy(y + i, &bits, sizeof(float));
    }
}

/* Row `row` of a part (its own numbering) into y (n floats); 0 where the type is not served. */
static int dequant_row(int64_t type, const uint8_t *data, int64_t row_bytes, int64_t row, float *y, int64_t n) {
    const uint8_t *b = data + row * row_bytes;
    switch (type) {
    case GGML_F32: memcpy(y, b, sizeof(float) * n); return 1;
    case GGML_F16: row_f16(b, y, n); return 1;
    case GGML_BF16: row_bf16(b, y, n); return 1;
    case GGML_Q8_0: row_q8_0(b, y, n); return 1;
    case GGML_Q4_0: row_q4_0(b, y, n); return 1;
    case GGML_Q4_1: row_q4_1(b, y, n); return 1;
    case GGML_Q5_0: row_q5_0(b, y, n); return 1;
    case GGML_Q5_1: row_q5_1(b, y, n); return 1;
    case GGML_IQ4_NL: row_iq4_nl(b, y, n); return 1;
    case GGML_Q2_K: row_q2_k(b, y, n); return 1;
    case GGML_Q3_K: row_q3_k(b, y, n); return 1;
    case GGML_Q4_K: row_k4(b, y, n, 0); return 1;
    case GGML_Q5_K: row_k4(b, y, n, 1); return 1;
    case GGML_Q6_K: row_q6_k(b, y, n); return 1;
    case GGML_IQ4_XS: row_iq4_xs(b, y, n); return 1;
    default: return int_dequant_row(type, data, row_bytes, row, y, n);
    }
}

/* Which part row o of the weight lies in, and its row there. */
static inline const int64_t *part_of(const int64_t *w, int64_t o, int64_t *row) {
    const int64_t *p = w + W_FIRST;
    for (int64_t k = 0; k + 1 < w[W_PARTS] && o >= p[P_ROWS]; ++k, p += PART_FIELDS) o -= p[P_ROWS];
    *row = o;
    return p;
}

/* Rows [o0, o1) of the weight, dequantized into y ((o1 - o0), in). */
void token_lab_dequant(const int64_t *w, int64_t o0, int64_t o1, float *y) {
    const int64_t in = w[W_IN];
    for (int64_t o = o0; o < o1; ++o) {
        int64_t row;
        const int64_t *p = part_of(w, o, &row);
        if (!dequant_row(p[P_TYPE], (const uint8_t *)(intptr_t)p[P_DATA], p[P_ROW_BYTES], row, y + (o - o0) * in, in))
            abort();  /* quant.py builds tables only of the types above */
    }
}

/* Rows ids[0..n) of the weight (an embedding's lookup) into y (n, in). */
void token_lab_gather(const int64_t *w, const int64_t *ids, int64_t n, float *y) {
    for (int64_t r = 0; r < n; ++r) token_lab_dequant(w, ids[r], ids[r] + 1, y + r * w[W_IN]);
}
