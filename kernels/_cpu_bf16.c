/* bfloat16 kernels for the CPU's decode step, each one C call where torch took several op calls, a fixed
cost each that a small model's step pays thirty times a token. No Python header: loaded with ctypes
(kernels/cpu_bf16.py). target_clones builds an x86-64-v4 (AVX-512), an x86-64-v3 (AVX2, FMA) and a
baseline copy of each kernel; the loader picks the CPU's at load time.

Arithmetic: as torch computes bfloat16 ops, each in float32 and rounded to bfloat16 (round to nearest even)
where torch's op ends, so RoPE and the residual add are bit for bit kernels/reference.py's; RMSNorm and the
attention's softmax differ from it only in the order of float32 sums and in float32's last bits of e^x (a
polynomial here, torch's own vectorized one there), SiLU in the latter. Each row's result depends on its
own inputs alone: a token's output is the same in any batch.
*/
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_cpu_bf16_bits.h"

#define MAX_HEAD_DIM 256
#define MAX_GROUP 32

enum {
    OK = 0, SHAPE_UNSUPPORTED = -1, NO_MEMORY = -2, CONTEXT_OUT_OF_TABLE = -3, BLOCK_OUT_OF_POOL = -4,
    POSITION_OUT_OF_TABLE = -5, SLOT_OUT_OF_POOL = -6,
};

/* e^x in a form the compiler vectorizes (libm's expf is a call per element): 2^n * e^r, n = x / ln 2 rounded
(by adding 1.5 * 2^23, whose float sum keeps n in its low bits: no floorf, which gcc leaves scalar), r = x - n ln 2
in two parts (Cody-Waite), e^r by Cephes' degree-6 polynomial, within 2 ulp of expf. */
static inline float exp_vectorizable(float x) {
    const float round_shift = 12582912.0f;  /* 1.5 * 2^23 */
    float clamped = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);  /* fminf/fmaxf kept the loop scalar */
    float shifted = clamped * 1.44269504088896341f + round_shift;
    float n = shifted - round_shift;
    float r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    uint32_t n_bits, scale_bits;
    memcpy(&n_bits, &shifted, sizeof n_bits);
    scale_bits = (n_bits - 0x4b400000u + 127u) << 23;  /* 2^n: n + 127 in the exponent field */
    float scale;
    memcpy(&scale, &scale_bits, sizeof scale);
    return x > 88.7f ? INFINITY : (x < -87.3f ? 0.0f : y * scale);
}

/* The position's row of one kv head, converted to float32 into `row`. */
static inline void load_row(const uint16_t *cache, const int64_t *table, int64_t position, int64_t block_size,
                            int64_t block_stride, int64_t position_stride, int64_t head_offset, int64_t dim,
                            float *row) {
    const uint16_t *source = cache + table[position / block_size] * block_stride
                             + (position % block_size) * position_stride + head_offset;
    for (int64_t d = 0; d < dim; d++) row[d] = bf16_to_float(source[d]);
}

/* The operands of one decode attention call, as kvf_decode_attention_bf16 takes them. */
struct attention_call {
    const uint16_t *query, *key_cache, *value_cache;
    const int64_t *block_tables, *context_lens;
    uint16_t *out;
    int64_t table_stride, q_heads, kv_heads, dim, block_size, block_stride, position_stride, head_stride;
    float scale;
};

/* Sequence b's attention for kv head h's group of query heads, `scores` room for its length x group. */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
static void attend(const struct attention_call *call, int64_t b, int64_t h, float *scores) {
    int64_t length = call->context_lens[b], dim = call->dim, group = call->q_heads / call->kv_heads;
    int64_t block_size = call->block_size, block_stride = call->block_stride, position_stride = call->position_stride;
    const int64_t *table = call->block_tables + b * call->table_stride;
    float queries[MAX_GROUP][MAX_HEAD_DIM], sums[MAX_GROUP][MAX_HEAD_DIM], row[MAX_HEAD_DIM];
    for (int64_t g = 0; g < group; g++) {
        const uint16_t *source = call->query + (b * call->q_heads + h * group + g) * dim;
        for (int64_t d = 0; d < dim; d++) queries[g][d] = bf16_to_float(source[d]);
    }
    float largest[MAX_GROUP];
    for (int64_t g = 0; g < group; g++) largest[g] = -INFINITY;
    for (int64_t t = 0; t < length; t++) {
        load_row(call->key_cache, table, t, block_size, block_stride, position_stride, h * call->head_stride, dim, row);
        for (int64_t g = 0; g < group; g++) {
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < dim; d++) dot += queries[g][d] * row[d];
            dot *= call->scale;
            scores[g * length + t] = dot;
            if (dot > largest[g]) largest[g] = dot;
        }
    }
    float totals[MAX_GROUP];
    for (int64_t g = 0; g < group; g++) {
        float *weights = scores + g * length, total = 0.0f, top = largest[g];
#pragma omp simd reduction(+ : total)
        for (int64_t t = 0; t < length; t++) {
            weights[t] = exp_vectorizable(weights[t] - top);
            total += weights[t];
        }
        totals[g] = total;
        memset(sums[g], 0, sizeof(float) * (size_t)dim);
    }
    for (int64_t t = 0; t < length; t++) {
        load_row(call->value_cache, table, t, block_size, block_stride, position_stride, h * call->head_stride, dim, row);
        for (int64_t g = 0; g < group; g++) {
            float weight = scores[g * length + t];
            for (int64_t d = 0; d < dim; d++) sums[g][d] += weight * row[d];
        }
    }
    for (int64_t g = 0; g < group; g++) {
        uint16_t *target = call->out + (b * call->q_heads + h * group + g) * dim;
        float inverse = 1.0f / totals[g];
        for (int64_t d = 0; d < dim; d++) target[d] = float_to_bf16(sums[g][d] * inverse);
    }
}

/* Paged decode attention, one query token per sequence, reading K and V in place from the pool's blocks:
each kv head's group of query heads at once, the scores of every context position in float32, a softmax,
the values weighted in float32, the output rounded once (`_grouped_attention_float32` in reference.py).
query, out: [batch, q_heads, dim], packed. key_cache, value_cache: [num_blocks, block_size, kv_heads, dim]
   views with these strides (in elements; dim's is 1). block_tables: [batch, table_width] with row stride
   table_stride. Returns OK or what was wrong, before anything is written on a bad table.
The (sequence, kv head) pairs are shared out among `threads` threads of an OpenMP region, a pair at a time
as each thread comes free (sequences differ in length). The library binds to torch's libgomp, as
kernels/_cpu_gemv.c explains: the threads are torch's own. */
int kvf_decode_attention_bf16(const uint16_t *query, const uint16_t *key_cache, const uint16_t *value_cache,
                              const int64_t *block_tables, int64_t table_stride, int64_t table_width,
                              const int64_t *context_lens, uint16_t *out, int64_t batch, int64_t q_heads,
                              int64_t kv_heads, int64_t dim, int64_t num_blocks, int64_t block_size,
                              int64_t block_stride, int64_t position_stride, int64_t head_stride, float scale,
                              int64_t threads) {
    if (kv_heads < 1 || q_heads % kv_heads || q_heads / kv_heads > MAX_GROUP || dim < 1 || dim > MAX_HEAD_DIM)
        return SHAPE_UNSUPPORTED;
    int64_t group = q_heads / kv_heads, longest = 1, pairs = batch * kv_heads;
    for (int64_t b = 0; b < batch; b++) {
        int64_t length = context_lens[b];
        if (length < 1 || length > table_width * block_size) return CONTEXT_OUT_OF_TABLE;
        for (int64_t i = 0; i < (length + block_size - 1) / block_size; i++) {
            int64_t block = block_tables[b * table_stride + i];
            if (block < 0 || block >= num_blocks) return BLOCK_OUT_OF_POOL;
        }
        if (length > longest) longest = length;
    }
    if (threads > pairs) threads = pairs;
    if (threads < 1) threads = 1;
    size_t room = (size_t)longest * (size_t)group;  /* each thread's scores */
    float *scores = malloc(sizeof(float) * room * (size_t)threads);
    if (!scores) return NO_MEMORY;
    struct attention_call call = {query, key_cache, value_cache, block_tables, context_lens, out, table_stride,
                                  q_heads, kv_heads, dim, block_size, block_stride, position_stride, head_stride,
                                  scale};
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1)
    for (int64_t pair = 0; pair < pairs; pair++)
        attend(&call, pair / kv_heads, pair % kv_heads, scores + room * (size_t)omp_get_thread_num());
    free(scores);
    return OK;
}

/* Residual add, then RMSNorm of each row: x + residual rounded (the new residual, into `residual_out`), its
mean square in float32, the row times its reciprocal root rounded, then times the weight rounded
(reference.rms_norm's 16-bit arithmetic). Without a residual (NULL) the row itself is normalized and
`residual_out` is not written. x, residual, weight, out, residual_out: packed. */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void kvf_rms_norm_bf16(const uint16_t *x, const uint16_t *residual, const uint16_t *weight, uint16_t *out,
                       uint16_t *residual_out, int64_t rows, int64_t width, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *row = x + r * width;
        uint16_t *target = out + r * width;
        if (residual) {
            const uint16_t *add = residual + r * width;
            uint16_t *sum_row = residual_out + r * width;
            for (int64_t i = 0; i < width; i++) sum_row[i] = float_to_bf16(bf16_to_float(row[i]) + bf16_to_float(add[i]));
            row = sum_row;
        }
        float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
        for (int64_t i = 0; i < width; i++) squares += bf16_to_float(row[i]) * bf16_to_float(row[i]);
        float inverse = 1.0f / sqrtf(squares / (float)width + eps);
        for (int64_t i = 0; i < width; i++) {
            float normalized = bf16_to_float(float_to_bf16(bf16_to_float(row[i]) * inverse));
            target[i] = float_to_bf16(bf16_to_float(weight[i]) * normalized);
        }
    }
}

/* Neox RoPE of one head's row: x * cos + rotated(x) * sin, each product and the sum rounded, cos and sin
rounded from the float32 table first (reference.rotate_neox on bfloat16). */
static inline void rotate_row(const uint16_t *x, const float *cos, const float *sin, int64_t dim, uint16_t *out) {
    int64_t half = dim / 2;
    for (int64_t d = 0; d < dim; d++) {
        float rotated = d < half ? -bf16_to_float(x[d + half]) : bf16_to_float(x[d - half]);
        float straight = bf16_to_float(float_to_bf16(bf16_to_float(x[d]) * bf16_to_float(float_to_bf16(cos[d]))));
        float turned = bf16_to_float(float_to_bf16(rotated * bf16_to_float(float_to_bf16(sin[d]))));
        out[d] = float_to_bf16(straight + turned);
    }
}

/* RoPE on q and k, the rotated k and v into their pool slots (block = slot / block_size), the rotated q into
q_out ([tokens, q_heads, dim], packed). q, k, v: rows `token_stride` apart, heads `dim` apart (the views of
one qkv matmul's output). cos_sin: float32 [max_positions, 2, dim]. Caches: [num_blocks, block_size,
kv_heads, dim] views with these strides, K and V alike. Every position and slot is checked first. */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
int kvf_rope_store_kv_bf16(const uint16_t *q, const uint16_t *k, const uint16_t *v, int64_t token_stride,
                           const int64_t *positions, const float *cos_sin, int64_t max_positions,
                           uint16_t *key_cache, uint16_t *value_cache, const int64_t *slot_mapping, uint16_t *q_out,
                           int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t dim, int64_t num_blocks,
                           int64_t block_size, int64_t block_stride, int64_t position_stride, int64_t head_stride) {
    if (dim % 2) return SHAPE_UNSUPPORTED;
    for (int64_t t = 0; t < tokens; t++) {
        if (positions[t] < 0 || positions[t] >= max_positions) return POSITION_OUT_OF_TABLE;
        if (slot_mapping[t] < 0 || slot_mapping[t] >= num_blocks * block_size) return SLOT_OUT_OF_POOL;
    }
    for (int64_t t = 0; t < tokens; t++) {
        const float *cos = cos_sin + positions[t] * 2 * dim, *sin = cos + dim;
        for (int64_t h = 0; h < q_heads; h++) rotate_row(q + t * token_stride + h * dim, cos, sin, dim, q_out + (t * q_heads + h) * dim);
        int64_t slot = slot_mapping[t];
        int64_t place = (slot / block_size) * block_stride + (slot % block_size) * position_stride;
        for (int64_t h = 0; h < kv_heads; h++) {
            rotate_row(k + t * token_stride + h * dim, cos, sin, dim, key_cache + place + h * head_stride);
            memcpy(value_cache + place + h * head_stride, v + t * token_stride + h * dim, sizeof(uint16_t) * (size_t)dim);
        }
    }
    return OK;
}

/* SiLU(gate) * up of each row of gate_up ([rows, 2 * width], packed): SiLU in float32 rounded, the product
rounded (reference.silu_and_mul on bfloat16). */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void kvf_silu_and_mul_bf16(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t width) {
    float activated[256];  /* a chunk of the row's SiLU: two plain loops, each of which gcc vectorizes */
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *gate = gate_up + r * 2 * width, *up = gate + width;
        uint16_t *target = out + r * width;
        for (int64_t start = 0; start < width; start += 256) {
            int64_t count = width - start < 256 ? width - start : 256;
#pragma omp simd
            for (int64_t i = 0; i < count; i++) {
                float g = bf16_to_float(gate[start + i]);
                activated[i] = bf16_to_float(float_to_bf16(g / (1.0f + exp_vectorizable(-g))));
            }
            for (int64_t i = 0; i < count; i++)
                target[start + i] = float_to_bf16(activated[i] * bf16_to_float(up[start + i]));
        }
    }
}
