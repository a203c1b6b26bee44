/* Paged decode attention for bfloat16 on the CPU, reading K and V in place from the pool's blocks.

One query token per sequence, each kv head's group of query heads at once: the scores of every context
position in float32, a softmax, the values weighted in float32, the output rounded to bfloat16 (round to
nearest even, as torch rounds). The arithmetic of `_grouped_attention_float32` in kernels/reference.py,
which it is tested against; only the order of the sums differs. Each sequence's result depends on its own
inputs alone, so a token's output is the same in any batch.

Why C: torch reaches the same result through about fifteen op calls a layer (gathering the blocks,
converting them to float32, two matmuls, a mask, a softmax), each a fixed cost that a small model's decode
step pays thirty times per token. No Python header: loaded with ctypes (kernels/cpu_attention.py).
target_clones builds an AVX-512, an AVX2 and a baseline copy; the loader picks the CPU's at load time.
*/
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HEAD_DIM 256
#define MAX_GROUP 32

enum { OK = 0, SHAPE_UNSUPPORTED = -1, NO_MEMORY = -2, CONTEXT_OUT_OF_TABLE = -3, BLOCK_OUT_OF_POOL = -4 };

static inline float bf16_to_float(uint16_t value) {
    union { uint32_t bits; float number; } convert = { .bits = (uint32_t)value << 16 };
    return convert.number;
}

static inline uint16_t float_to_bf16(float number) {
    union { float number; uint32_t bits; } convert = { .number = number };
    if ((convert.bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((convert.bits >> 16) | 0x40);  /* NaN */
    convert.bits += 0x7fffu + ((convert.bits >> 16) & 1u);
    return (uint16_t)(convert.bits >> 16);
}

/* The position's row of one kv head, converted to float32 into `row`. */
static inline void load_row(const uint16_t *cache, const int64_t *table, int64_t position, int64_t block_size,
                            int64_t block_stride, int64_t position_stride, int64_t head_offset, int64_t dim,
                            float *row) {
    const uint16_t *source = cache + table[position / block_size] * block_stride
                             + (position % block_size) * position_stride + head_offset;
    for (int64_t d = 0; d < dim; d++) row[d] = bf16_to_float(source[d]);
}

/* query, out: [batch, q_heads, dim], packed. key_cache, value_cache: [num_blocks, block_size, kv_heads, dim]
   views with these strides (in elements; dim's is 1). block_tables: [batch, table_width] with row stride
   table_stride. Returns OK or what was wrong, before anything is written on a bad table. */
__attribute__((target_clones("avx512f", "avx2", "default")))
int kvf_decode_attention_bf16(const uint16_t *query, const uint16_t *key_cache, const uint16_t *value_cache,
                              const int64_t *block_tables, int64_t table_stride, int64_t table_width,
                              const int64_t *context_lens, uint16_t *out, int64_t batch, int64_t q_heads,
                              int64_t kv_heads, int64_t dim, int64_t num_blocks, int64_t block_size,
                              int64_t block_stride, int64_t position_stride, int64_t head_stride, float scale) {
    if (kv_heads < 1 || q_heads % kv_heads || q_heads / kv_heads > MAX_GROUP || dim < 1 || dim > MAX_HEAD_DIM)
        return SHAPE_UNSUPPORTED;
    int64_t group = q_heads / kv_heads, longest = 1;
    for (int64_t b = 0; b < batch; b++) {
        int64_t length = context_lens[b];
        if (length < 1 || length > table_width * block_size) return CONTEXT_OUT_OF_TABLE;
        for (int64_t i = 0; i < (length + block_size - 1) / block_size; i++) {
            int64_t block = block_tables[b * table_stride + i];
            if (block < 0 || block >= num_blocks) return BLOCK_OUT_OF_POOL;
        }
        if (length > longest) longest = length;
    }
    float *scores = malloc(sizeof(float) * (size_t)longest * (size_t)group);
    if (!scores) return NO_MEMORY;
    float queries[MAX_GROUP][MAX_HEAD_DIM], sums[MAX_GROUP][MAX_HEAD_DIM], row[MAX_HEAD_DIM];
    for (int64_t b = 0; b < batch; b++) {
        int64_t length = context_lens[b];
        const int64_t *table = block_tables + b * table_stride;
        for (int64_t h = 0; h < kv_heads; h++) {
            for (int64_t g = 0; g < group; g++) {
                const uint16_t *source = query + (b * q_heads + h * group + g) * dim;
                for (int64_t d = 0; d < dim; d++) queries[g][d] = bf16_to_float(source[d]);
            }
            float largest[MAX_GROUP];
            for (int64_t g = 0; g < group; g++) largest[g] = -INFINITY;
            for (int64_t t = 0; t < length; t++) {
                load_row(key_cache, table, t, block_size, block_stride, position_stride, h * head_stride, dim, row);
                for (int64_t g = 0; g < group; g++) {
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int64_t d = 0; d < dim; d++) dot += queries[g][d] * row[d];
                    dot *= scale;
                    scores[g * length + t] = dot;
                    if (dot > largest[g]) largest[g] = dot;
                }
            }
            float totals[MAX_GROUP];
            for (int64_t g = 0; g < group; g++) {
                float *weights = scores + g * length, total = 0.0f, top = largest[g];
                for (int64_t t = 0; t < length; t++) {
                    weights[t] = expf(weights[t] - top);
                    total += weights[t];
                }
                totals[g] = total;
                memset(sums[g], 0, sizeof(float) * (size_t)dim);
            }
            for (int64_t t = 0; t < length; t++) {
                load_row(value_cache, table, t, block_size, block_stride, position_stride, h * head_stride, dim, row);
                for (int64_t g = 0; g < group; g++) {
                    float weight = scores[g * length + t];
                    for (int64_t d = 0; d < dim; d++) sums[g][d] += weight * row[d];
                }
            }
            for (int64_t g = 0; g < group; g++) {
                uint16_t *target = out + (b * q_heads + h * group + g) * dim;
                float inverse = 1.0f / totals[g];
                for (int64_t d = 0; d < dim; d++) target[d] = float_to_bf16(sums[g][d] * inverse);
            }
        }
    }
    free(scores);
    return OK;
}
