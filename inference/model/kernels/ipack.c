/* The integer products' weights: a GGUF file's blocks repacked 16 rows at a time, and read back
 * (included by kernels.c, after quant.c; the layouts are described in islices.c). */

enum { I4_0 = 1002, I4_1 = 1003, I5_0 = 1006, I8_0 = 1008, I4_K = 1012, I5_K = 1013, I6_K = 1014 };
enum { GROUP = 16 };

/* ---------------------------------------------------------------- the repacked layouts */
static int is_int_type(int64_t t) { return t >= I4_0 && t <= I6_K; }
static int64_t int_of(int64_t gguf_type) {
    switch (gguf_type) {
    case GGML_Q4_0: return I4_0;
    case GGML_Q4_1: return I4_1;
    case GGML_Q5_0: return I5_0;
    case GGML_Q8_0: return I8_0;
    case GGML_Q4_K: return I4_K;
    case GGML_Q5_K: return I5_K;
    case GGML_Q6_K: return I6_K;
    default: return 0;
    }
}
static int64_t int_block_inputs(int64_t t) { return t >= I4_K ? 256 : 32; }
static int64_t int_block_bytes(int64_t t) {  /* a group of 16 rows' bytes for one block */
    switch (t) {
    case I4_0: return 288;
    case I4_1: return 320;
    case I5_0: return 352;
    case I8_0: return 544;
    case I4_K: return 2368;
    case I5_K: return 2880;
    case I6_K: return 3360;
    default: return 0;
    }
}

/* One block of a file row as integers q[] (0 .. 2^bits - 1) and its scales. */
typedef struct { int q[256]; float d, m; uint8_t sc[16], mn[8]; } unpacked_t;

static void unpack_file_block(int64_t type, const uint8_t *b, unpacked_t *u) {
    switch (type) {
    case GGML_Q4_0: case GGML_Q4_1: case GGML_Q5_0: case GGML_Q8_0: {
        const int off = type == GGML_Q4_0 || type == GGML_Q8_0 ? 2 : type == GGML_Q4_1 ? 4 : 6;
        u->d = f16(b);
        u->m = type == GGML_Q4_1 ? f16(b + 2) : 0.0f;
        uint32_t qh = 0;
        if (type == GGML_Q5_0) memcpy(&qh, b + 2, 4);
        for (int j = 0; j < 32; ++j) {
            if (type == GGML_Q8_0) { u->q[j] = (int8_t)b[2 + j] + 128; continue; }
            const uint8_t v = b[off + j % 16];
            u->q[j] = (j < 16 ? v & 0xf : v >> 4) | (type == GGML_Q5_0 ? (int)((qh >> j) & 1) << 4 : 0);
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
    }
}

static void put_f16(uint8_t *p, float v) {
    const _Float16 h = (_Float16)v;  /* exact: v came from an f16 */
    memcpy(p, &h, 2);
}

/* 32 inputs of the group's 16 rows (q[r][i]) into their planes at g. */
static void pack_planes(int64_t t, int q[GROUP][32], uint8_t *g) {
    if (t == I8_0) {
        for (int J = 0; J < 8; ++J)
            for (int r = 0; r < GROUP; ++r)
                for (int k = 0; k < 4; ++k) g[64 * J + 4 * r + k] = (uint8_t)q[r][4 * J + k];
        return;
    }
    for (int J = 0; J < 4; ++J)
        for (int r = 0; r < GROUP; ++r)
            for (int k = 0; k < 4; ++k) g[64 * J + 4 * r + k] = (uint8_t)((q[r][4 * J + k] & 0xf) | (q[r][16 + 4 * J + k] & 0xf) << 4);
    uint8_t *hi = g + 256;
    if (t == I5_0 || t == I5_K) {
        memset(hi, 0, 64);
        for (int J = 0; J < 8; ++J)
            for (int r = 0; r < GROUP; ++r)
                for (int k = 0; k < 4; ++k)
                    if (q[r][4 * J + k] & 16) hi[8 * J + (4 * r + k) / 8] |= (uint8_t)(1 << ((4 * r + k) % 8));
    } else if (t == I6_K) {
        memset(hi, 0, 128);
        for (int p = 0; p < 2; ++p)
            for (int m = 0; m < 4; ++m)
                for (int r = 0; r < GROUP; ++r)
                    for (int k = 0; k < 4; ++k)
                        hi[64 * p + 4 * r + k] |= (uint8_t)(((q[r][4 * (4 * p + m) + k] >> 4) & 3) << (2 * m));
    }
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
            if (t < I4_K) {
                for (int r = 0; r < GROUP; ++r) memcpy(q[r], u[r].q, sizeof q[r]);
                pack_planes(t, q, out);
                uint8_t *sc = out + bb - (t == I4_1 ? 64 : 32);
                for (int r = 0; r < GROUP; ++r) {
                    put_f16(sc + 2 * r, u[r].d);
                    if (t == I4_1) put_f16(sc + 32 + 2 * r, u[r].m);
                }
                continue;
            }
            const int head = t == I6_K ? 288 : 320, plane = t == I4_K ? 256 : t == I5_K ? 320 : 384;
            for (int r = 0; r < GROUP; ++r) {
                put_f16(out + 2 * r, u[r].d);
                if (t == I6_K) {
                    for (int s = 0; s < 16; ++s) out[32 + 16 * s + r] = u[r].sc[s];
                } else {
                    put_f16(out + 32 + 2 * r, u[r].m);
                    for (int s = 0; s < 8; ++s) {
                        out[64 + 16 * s + r] = u[r].sc[s];
                        out[192 + 16 * s + r] = u[r].mn[s];
                    }
                }
            }
            for (int s = 0; s < 8; ++s) {
                for (int r = 0; r < GROUP; ++r) memcpy(q[r], u[r].q + 32 * s, sizeof q[r]);
                pack_planes(t, q, out + head + s * plane);
            }
        }
    free(u);
    free(q);
}

/* ---------------------------------------------------------------- reading one weight back
 * Row r of a group, block b's 32 (or 256) weights as integers, then dequantized as quant.c's
 * row_* functions compute them (the same float32 operations: the same bits as gguf's). */
static int plane_q(int64_t t, const uint8_t *g, int r, int i) {
    const int J = i / 4, k = i % 4;
    if (t == I8_0) return g[64 * J + 4 * r + k];
    int q = (g[64 * (J % 4) + 4 * r + k] >> (J < 4 ? 0 : 4)) & 0xf;
    if (t == I5_0 || t == I5_K) q |= ((g[256 + 8 * J + (4 * r + k) / 8] >> ((4 * r + k) % 8)) & 1) << 4;
    if (t == I6_K) q |= ((g[256 + 64 * (J / 4) + 4 * r + k] >> (2 * (J % 4))) & 3) << 4;
    return q;
}

static void int_row(int64_t t, const uint8_t *group0, int64_t in, int r, float *y) {
    const int64_t bb = int_block_bytes(t), nb = in / int_block_inputs(t);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *g = group0 + b * bb;
        if (t < I4_K) {
            const uint8_t *sc = g + bb - (t == I4_1 ? 64 : 32);
            const float d = f16(sc + 2 * r), m = t == I4_1 ? f16(sc + 32 + 2 * r) : 0.0f;
            for (int i = 0; i < 32; ++i) {
                const int q = plane_q(t, g, r, i);
                y[32 * b + i] = t == I4_0 ? d * (float)(q - 8) : t == I4_1 ? d * (float)q + m
                              : t == I5_0 ? d * (float)(q - 16) : (float)(q - 128) * d;
            }
            continue;
        }
        const int head = t == I6_K ? 288 : 320, plane = t == I4_K ? 256 : t == I5_K ? 320 : 384;
        const float d = f16(g + 2 * r);
        for (int i = 0; i < 256; ++i) {
            const int s = i / 32, q = plane_q(t, g + head + s * plane, r, i % 32);
            if (t == I6_K) {
                y[256 * b + i] = (d * (float)(int8_t)g[32 + 16 * (i / 16) + r]) * (float)(q - 32);
            } else {
                const float ds = d * (float)g[64 + 16 * s + r], dm = f16(g + 32 + 2 * r) * (float)g[192 + 16 * s + r];
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
