/* The integer products' weights: a GGUF file's blocks repacked 16 rows at a time, and read back
 * (included by kernels.c, after quant.c; the layouts are described in islices.c). */

enum { I4_0 = 1002, I4_1 = 1003, I5_0 = 1006, I5_1 = 1007, I8_0 = 1008, I2_K = 1010, I3_K = 1011,
       I4_K = 1012, I5_K = 1013, I6_K = 1014, IN_L = 1020, IX_S = 1023 };  /* 1000 + the file's type */
enum { GROUP = 16 };

/* ---------------------------------------------------------------- the repacked layouts */
static int64_t int_of(int64_t gguf_type) {
    switch (gguf_type) {
    case GGML_Q4_0: case GGML_Q4_1: case GGML_Q5_0: case GGML_Q5_1: case GGML_Q8_0: case GGML_IQ4_NL:
    case GGML_Q2_K: case GGML_Q3_K: case GGML_Q4_K: case GGML_Q5_K: case GGML_Q6_K: case GGML_IQ4_XS:
        return 1000 + gguf_type;
    default: return 0;
    }
}
static int is_int_type(int64_t t) { return t > 1000 && int_of(t - 1000) == t; }
static inline int is_k(int64_t t) { return t == I2_K || t == I3_K || t == I4_K || t == I5_K || t == I6_K || t == IX_S; }
static inline int has_min(int64_t t) { return t == I4_1 || t == I5_1; }  /* a legacy block's m (d q + m) */
static inline int has_q5(int64_t t) { return t == I5_0 || t == I5_1 || t == I5_K; }
static inline int is_iq4(int64_t t) { return t == IN_L || t == IX_S; }
/* What the weights' integers are stored as, above the file's (q - off): the slices' sums correct it. */
static inline int int_offset(int64_t t) {
    return t == I4_0 ? 8 : t == I5_0 ? 16 : t == I8_0 || is_iq4(t) ? 128 : t == I3_K ? 4 : t == I6_K ? 32 : 0;
}
/* A K-type group block: its head (scales) and each of its 8 sub-blocks' planes, in bytes. */
static inline int k_head(int64_t t) { return t == I6_K || t == I3_K ? 288 : t == IX_S ? 160 : 320; }
static inline int k_plane(int64_t t) {
    return t == I2_K ? 128 : t == I3_K ? 192 : t == I5_K ? 320 : t == I6_K ? 384 : 256;
}
static int64_t int_block_inputs(int64_t t) { return is_k(t) ? 256 : 32; }
static int64_t int_block_bytes(int64_t t) {  /* a group of 16 rows' bytes for one block */
    if (is_k(t)) return k_head(t) + 8 * k_plane(t);
    return (t == I8_0 ? 512 : 256) + (has_q5(t) ? 64 : 0) + (has_min(t) ? 64 : 32);
}

/* One block of a file row as integers q[] (as stored: 0 .. 2^bits - 1, or IQ4's index) and its
 * scales (a signed scale as its int8's byte; Q2_K's sc: the file's byte, scale and min). */
typedef struct { int q[256]; float d, m; uint8_t sc[16], mn[8]; } unpacked_t;

static void unpack_file_block(int64_t type, const uint8_t *b, unpacked_t *u) {
    switch (type) {
    case GGML_Q4_0: case GGML_Q4_1: case GGML_Q5_0: case GGML_Q5_1: case GGML_Q8_0: case GGML_IQ4_NL: {
        const int q5 = type == GGML_Q5_0 || type == GGML_Q5_1, min = type == GGML_Q4_1 || type == GGML_Q5_1;
        const int off = 2 + 2 * min + 4 * q5;  /* d, m, qh */
        u->d = f16(b);
        u->m = min ? f16(b + 2) : 0.0f;
        uint32_t qh = 0;
        if (q5) memcpy(&qh, b + 2 + 2 * min, 4);
        for (int j = 0; j < 32; ++j) {
            if (type == GGML_Q8_0) { u->q[j] = (int8_t)b[2 + j] + 128; continue; }
            const uint8_t v = b[off + j % 16];
            u->q[j] = (j < 16 ? v & 0xf : v >> 4) | (q5 ? (int)((qh >> j) & 1) << 4 : 0);
        }
        break;
    }
    case GGML_Q4_K: case GGML_Q5_K: {
        const int q5 = type == GGML_Q5_K;
        const uint8_t *qh = b + 16, *qs = b + (q5 ? 48 : 16);
        u->d = f16(b);
        u->m = f16(b + 2);
        for (int s = 0; s < 8; ++s) {
            scale_min_k4(b + 4, s, &u->sc[s], &u->mn[s]);
            for (int l = 0; l < 32; ++l)
                u->q[32 * s + l] = ((qs[(s / 2) * 32 + l] >> (4 * (s % 2))) & 0xf) | (q5 ? ((qh[l] >> s) & 1) << 4 : 0);
        }
        break;
    }
    case GGML_Q6_K: {
        const uint8_t *ql = b, *qh = b + 128;
        u->d = f16(b + 208);
        memcpy(u->sc, b + 192, 16);
        for (int e = 0; e < 256; ++e) {
            const int h = e / 128, k = (e % 128) / 32, l = e % 32;
            u->q[e] = ((ql[h * 64 + (k % 2) * 32 + l] >> (4 * (k / 2))) & 0xf) | ((qh[h * 32 + l] >> (2 * k)) & 3) << 4;
        }
        break;
    }
    case GGML_Q2_K: case GGML_Q3_K: {  /* Q3_K's q - 4 (1 - bit) stored as q + 4 bit: 0 .. 7 */
        const int q3 = type == GGML_Q3_K;
        u->d = f16(b + (q3 ? 108 : 80));
        u->m = q3 ? 0.0f : f16(b + 82);
        for (int j = 0; j < 16; ++j) u->sc[j] = q3 ? (uint8_t)(int8_t)scale_q3_k(b + 96, j) : b[j];
        for (int e = 0; e < 256; ++e) {
            const int h = e / 128, k = (e % 128) / 32, l = e % 32;
            u->q[e] = ((b[(q3 ? 32 : 16) + 32 * h + l] >> (2 * k)) & 3) | (q3 ? ((b[l] >> (e / 32)) & 1) << 2 : 0);
        }
        break;
    }
    case GGML_IQ4_XS: {
        u->d = f16(b);
        for (int s = 0; s < 8; ++s) {
            u->sc[s] = (uint8_t)(int8_t)scale_iq4_xs(b, s);
            for (int j = 0; j < 32; ++j) u->q[32 * s + j] = (b[8 + 16 * s + j % 16] >> (4 * (j / 16))) & 0xf;
        }
        break;
    }
    }
}

static void put_f16(uint8_t *p, float v) {
    const _Float16 h = (_Float16)v;  /* exact: v came from an f16 */
    memcpy(p, &h, 2);
}

/* Bits shift, shift + 1 of 32 inputs' q[r][i]: register 4p + m's in bits 2m, 2m + 1 of plane p (128 bytes). */
static void pack_pairs(int q[GROUP][32], int shift, uint8_t *g) {
    memset(g, 0, 128);
    for (int p = 0; p < 2; ++p)
        for (int m = 0; m < 4; ++m)
            for (int r = 0; r < GROUP; ++r)
                for (int k = 0; k < 4; ++k) g[64 * p + 4 * r + k] |= (uint8_t)(((q[r][4 * (4 * p + m) + k] >> shift) & 3) << (2 * m));
}

/* Bit `bit` of 32 inputs' q[r][i]: register J's as 64 bits (byte 4r + k's in bit 4r + k: 64 bytes). */
static void pack_bits(int q[GROUP][32], int bit, uint8_t *g) {
    memset(g, 0, 64);
    for (int J = 0; J < 8; ++J)
        for (int r = 0; r < GROUP; ++r)
            for (int k = 0; k < 4; ++k)
                if ((q[r][4 * J + k] >> bit) & 1) g[8 * J + (4 * r + k) / 8] |= (uint8_t)(1 << ((4 * r + k) % 8));
}

/* 32 inputs of the group's 16 rows (q[r][i]) into their planes at g. */
static void pack_planes(int64_t t, int q[GROUP][32], uint8_t *g) {
    if (t == I8_0) {
        for (int J = 0; J < 8; ++J)
            for (int r = 0; r < GROUP; ++r)
                for (int k = 0; k < 4; ++k) g[64 * J + 4 * r + k] = (uint8_t)q[r][4 * J + k];
        return;
    }
    if (t == I2_K || t == I3_K) {  /* two bits, then Q3_K's third */
        pack_pairs(q, 0, g);
        if (t == I3_K) pack_bits(q, 2, g + 128);
        return;
    }
    for (int J = 0; J < 4; ++J)
        for (int r = 0; r < GROUP; ++r)
            for (int k = 0; k < 4; ++k) g[64 * J + 4 * r + k] = (uint8_t)((q[r][4 * J + k] & 0xf) | (q[r][16 + 4 * J + k] & 0xf) << 4);
    if (has_q5(t)) pack_bits(q, 4, g + 256);
    else if (t == I6_K) pack_pairs(q, 4, g + 256);
}

/* The repacked bytes of `rows` rows of a file part (rows padded to whole groups with zeros). */
int64_t token_lab_int_bytes(int64_t gguf_type, int64_t rows, int64_t in) {
    const int64_t t = int_of(gguf_type);
    return t ? (rows + GROUP - 1) / GROUP * (in / int_block_inputs(t)) * int_block_bytes(t) : 0;
}

void token_lab_int_repack(int64_t gguf_type, const uint8_t *src, int64_t rows, int64_t in, int64_t row_bytes, uint8_t *dst) {
    const int64_t t = int_of(gguf_type), nb = in / int_block_inputs(t), bb = int_block_bytes(t);
    const int64_t file_block = row_bytes / nb;
    unpacked_t *u = malloc(sizeof(unpacked_t) * GROUP);
    int (*q)[32] = malloc(sizeof(int) * GROUP * 32);
    if (!u || !q) abort();
    for (int64_t g = 0; g < (rows + GROUP - 1) / GROUP; ++g)
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t *out = dst + (g * nb + b) * bb;
            for (int r = 0; r < GROUP; ++r) {
                const int64_t row = g * GROUP + r;
                if (row < rows) {
                    unpack_file_block(gguf_type, src + row * row_bytes + b * file_block, &u[r]);
                } else {  /* padding: weights 0 (Q8_0's stored q + 128 is 128) */
                    memset(&u[r], 0, sizeof(unpacked_t));
                    if (t == I8_0) for (int i = 0; i < 32; ++i) u[r].q[i] = 128;
                }
            }
            if (!is_k(t)) {
                for (int r = 0; r < GROUP; ++r) memcpy(q[r], u[r].q, sizeof q[r]);
                pack_planes(t, q, out);
                uint8_t *sc = out + bb - (has_min(t) ? 64 : 32);
                for (int r = 0; r < GROUP; ++r) {
                    put_f16(sc + 2 * r, u[r].d);
                    if (has_min(t)) put_f16(sc + 32 + 2 * r, u[r].m);
                }
                continue;
            }
            for (int r = 0; r < GROUP; ++r) {  /* the head: d, then dmin and the scales */
                put_f16(out + 2 * r, u[r].d);
                if (t == I6_K || t == I3_K || t == IX_S) {  /* signed scales, from byte 32 */
                    for (int s = 0; s < (t == IX_S ? 8 : 16); ++s) out[32 + 16 * s + r] = u[r].sc[s];
                    continue;
                }
                put_f16(out + 32 + 2 * r, u[r].m);
                for (int s = 0; s < (t == I2_K ? 16 : 8); ++s) out[64 + 16 * s + r] = u[r].sc[s];
                if (t != I2_K)
                    for (int s = 0; s < 8; ++s) out[192 + 16 * s + r] = u[r].mn[s];
            }
            for (int s = 0; s < 8; ++s) {
                for (int r = 0; r < GROUP; ++r) memcpy(q[r], u[r].q + 32 * s, sizeof q[r]);
                pack_planes(t, q, out + k_head(t) + s * k_plane(t));
            }
        }
    free(u);
    free(q);
}

/* ---------------------------------------------------------------- reading one weight back
 * Row r of a group, block b's 32 (or 256) weights as integers, then dequantized as quant.c's
 * row_* functions compute them (the same float32 operations: the same bits as gguf's). */
static const uint8_t IQ4_STORED[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};  /* + 128 */

/* Row r's weight for input i of the planes at g, as the integer products see it (the stored q). */
static int plane_q(int64_t t, const uint8_t *g, int r, int i) {
    const int J = i / 4, at = 4 * r + i % 4;  /* register J, byte at */
    if (t == I8_0) return g[64 * J + at];
    if (t == I2_K || t == I3_K)
        return ((g[64 * (J / 4) + at] >> (2 * (J % 4))) & 3) | (t == I3_K ? ((g[128 + 8 * J + at / 8] >> (at % 8)) & 1) << 2 : 0);
    int q = (g[64 * (J % 4) + at] >> (J < 4 ? 0 : 4)) & 0xf;
    if (has_q5(t)) q |= ((g[256 + 8 * J + at / 8] >> (at % 8)) & 1) << 4;
    if (t == I6_K) q |= ((g[256 + 64 * (J / 4) + at] >> (2 * (J % 4))) & 3) << 4;
    return is_iq4(t) ? IQ4_STORED[q] : q;
}

static void int_row(int64_t t, const uint8_t *group0, int64_t in, int r, float *y) {
    const int64_t bb = int_block_bytes(t), nb = in / int_block_inputs(t);
    const int off = int_offset(t);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *g = group0 + b * bb;
        if (!is_k(t)) {
            const uint8_t *sc = g + bb - (has_min(t) ? 64 : 32);
            const float d = f16(sc + 2 * r), m = has_min(t) ? f16(sc + 32 + 2 * r) : 0.0f;
            for (int i = 0; i < 32; ++i) {
                const int q = plane_q(t, g, r, i) - off;
                y[32 * b + i] = has_min(t) ? d * (float)q + m : t == I8_0 ? (float)q * d : d * (float)q;
            }
            continue;
        }
        const float d = f16(g + 2 * r), dmin = f16(g + 32 + 2 * r);
        for (int i = 0; i < 256; ++i) {
            const int s = i / 32, q = plane_q(t, g + k_head(t) + s * k_plane(t), r, i % 32) - off;
            if (t == I6_K || t == I3_K || t == IX_S) {  /* (d sc) q, a scale each 16 inputs (IQ4_XS: 32) */
                y[256 * b + i] = (d * (float)(int8_t)g[32 + 16 * (t == IX_S ? s : i / 16) + r]) * (float)q;
            } else if (t == I2_K) {
                const int sc = g[64 + 16 * (i / 16) + r];
                y[256 * b + i] = (d * (float)(sc & 0xf)) * (float)q - dmin * (float)(sc >> 4);
            } else {
                const float ds = d * (float)g[64 + 16 * s + r], dm = dmin * (float)g[192 + 16 * s + r];
                y[256 * b + i] = ds * (float)q - dm;
            }
        }
    }
}

/* Row `row` of a repacked part (groups `stride` bytes apart) into y (n floats); 0: not repacked. */
static int int_dequant_row(int64_t type, const uint8_t *data, int64_t stride, int64_t row, float *y, int64_t n) {
    if (!is_int_type(type)) return 0;
    int_row(type, data + (row / GROUP) * stride, n, (int)(row % GROUP), y);
    return 1;
}
