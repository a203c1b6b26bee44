/* The CPU's decode-step kernels for one element type, included by kernels/_cpu_decode.c once per type with
ELEMENT (the tensors' element type), TO_FLOAT and FROM_FLOAT (to and from float32, rounding as torch does),
ROUNDED (a float32 result rounded to ELEMENT and back: where torch's op on ELEMENT ends) and NAME (a name with
the type's suffix) defined. Every computation is in float32: for float32 tensors the conversions and the
roundings are nothing, and the kernels are reference.py's float32 arithmetic. No include guard: it is meant to
be included more than once. */

/* The position's row of one kv head, converted to float32 into `row`. */
static inline void NAME(load_row)(const ELEMENT *cache, const int64_t *table, int64_t position, int64_t block_size,
                            int64_t block_stride, int64_t position_stride, int64_t head_offset, int64_t dim,
                            float *row) {
    const ELEMENT *source = cache + table[position / block_size] * block_stride
                             + (position % block_size) * position_stride + head_offset;
    for (int64_t d = 0; d < dim; d++) row[d] = TO_FLOAT(source[d]);
}

/* The operands of one decode attention call, as NAME(kvf_decode_attention) takes them. */
struct NAME(attention_call) {
    const ELEMENT *query, *key_cache, *value_cache;
    const int64_t *block_tables, *context_lens;
    ELEMENT *out;
    int64_t table_stride, q_heads, kv_heads, dim, block_size, block_stride, position_stride, head_stride;
    float scale;
};

/* Sequence b's attention for kv head h's group of query heads, `scores` room for its length x group. */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
static void NAME(attend)(const struct NAME(attention_call) *call, int64_t b, int64_t h, float *scores) {
    int64_t length = call->context_lens[b], dim = call->dim, group = call->q_heads / call->kv_heads;
    int64_t block_size = call->block_size, block_stride = call->block_stride, position_stride = call->position_stride;
    const int64_t *table = call->block_tables + b * call->table_stride;
    float queries[MAX_GROUP][MAX_HEAD_DIM], sums[MAX_GROUP][MAX_HEAD_DIM], row[MAX_HEAD_DIM];
    for (int64_t g = 0; g < group; g++) {
        const ELEMENT *source = call->query + (b * call->q_heads + h * group + g) * dim;
        for (int64_t d = 0; d < dim; d++) queries[g][d] = TO_FLOAT(source[d]);
    }
    float largest[MAX_GROUP];
    for (int64_t g = 0; g < group; g++) largest[g] = -INFINITY;
    for (int64_t t = 0; t < length; t++) {
        NAME(load_row)(call->key_cache, table, t, block_size, block_stride, position_stride, h * call->head_stride, dim, row);
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
        NAME(load_row)(call->value_cache, table, t, block_size, block_stride, position_stride, h * call->head_stride, dim, row);
        for (int64_t g = 0; g < group; g++) {
            float weight = scores[g * length + t];
            for (int64_t d = 0; d < dim; d++) sums[g][d] += weight * row[d];
        }
    }
    for (int64_t g = 0; g < group; g++) {
        ELEMENT *target = call->out + (b * call->q_heads + h * group + g) * dim;
        float inverse = 1.0f / totals[g];
        for (int64_t d = 0; d < dim; d++) target[d] = FROM_FLOAT(sums[g][d] * inverse);
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
int NAME(kvf_decode_attention)(const ELEMENT *query, const ELEMENT *key_cache, const ELEMENT *value_cache,
                              const int64_t *block_tables, int64_t table_stride, int64_t table_width,
                              const int64_t *context_lens, ELEMENT *out, int64_t batch, int64_t q_heads,
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
    struct NAME(attention_call) call = {query, key_cache, value_cache, block_tables, context_lens, out, table_stride,
                                  q_heads, kv_heads, dim, block_size, block_stride, position_stride, head_stride,
                                  scale};
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1)
    for (int64_t pair = 0; pair < pairs; pair++)
        NAME(attend)(&call, pair / kv_heads, pair % kv_heads, scores + room * (size_t)omp_get_thread_num());
    free(scores);
    return OK;
}

/* Residual add, then RMSNorm of each row: x + residual rounded (the new residual, into `residual_out`), its
mean square in float32, the row times its reciprocal root rounded, then times the weight rounded
(reference.rms_norm's arithmetic). Without a residual (NULL) the row itself is normalized and
`residual_out` is not written. x, residual, weight, out, residual_out: packed. */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void NAME(kvf_rms_norm)(const ELEMENT *x, const ELEMENT *residual, const ELEMENT *weight, ELEMENT *out,
                       ELEMENT *residual_out, int64_t rows, int64_t width, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const ELEMENT *row = x + r * width;
        ELEMENT *target = out + r * width;
        if (residual) {
            const ELEMENT *add = residual + r * width;
            ELEMENT *sum_row = residual_out + r * width;
            for (int64_t i = 0; i < width; i++) sum_row[i] = FROM_FLOAT(TO_FLOAT(row[i]) + TO_FLOAT(add[i]));
            row = sum_row;
        }
        float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
        for (int64_t i = 0; i < width; i++) squares += TO_FLOAT(row[i]) * TO_FLOAT(row[i]);
        float inverse = 1.0f / sqrtf(squares / (float)width + eps);
        for (int64_t i = 0; i < width; i++) {
            float normalized = ROUNDED(TO_FLOAT(row[i]) * inverse);
            target[i] = FROM_FLOAT(TO_FLOAT(weight[i]) * normalized);
        }
    }
}

/* Neox RoPE of one head's row: x * cos + rotated(x) * sin, each product and the sum rounded, cos and sin
rounded from the float32 table first (reference.rotate_neox's arithmetic). Never a fused multiply-add (the
library's other kernels may have them): torch's separate products and sum round each, and float32 RoPE is its
bits. */
__attribute__((optimize("fp-contract=off"))) static void NAME(rotate_row)(const ELEMENT *x, const float *cos, const float *sin, int64_t dim, ELEMENT *out) {
    int64_t half = dim / 2;
    for (int64_t d = 0; d < dim; d++) {
        float rotated = d < half ? -TO_FLOAT(x[d + half]) : TO_FLOAT(x[d - half]);
        float straight = ROUNDED(TO_FLOAT(x[d]) * ROUNDED(cos[d]));
        float turned = ROUNDED(rotated * ROUNDED(sin[d]));
        out[d] = FROM_FLOAT(straight + turned);
    }
}

/* RoPE on q and k, the rotated k and v into their pool slots (block = slot / block_size), the rotated q into
q_out ([tokens, q_heads, dim], packed). q, k, v: rows `token_stride` apart, heads `dim` apart (the views of
one qkv matmul's output). cos_sin: float32 [max_positions, 2, dim]. Caches: [num_blocks, block_size,
kv_heads, dim] views with these strides, K and V alike. Every position and slot is checked first. */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
int NAME(kvf_rope_store_kv)(const ELEMENT *q, const ELEMENT *k, const ELEMENT *v, int64_t token_stride,
                           const int64_t *positions, const float *cos_sin, int64_t max_positions,
                           ELEMENT *key_cache, ELEMENT *value_cache, const int64_t *slot_mapping, ELEMENT *q_out,
                           int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t dim, int64_t num_blocks,
                           int64_t block_size, int64_t block_stride, int64_t position_stride, int64_t head_stride) {
    if (dim % 2) return SHAPE_UNSUPPORTED;
    for (int64_t t = 0; t < tokens; t++) {
        if (positions[t] < 0 || positions[t] >= max_positions) return POSITION_OUT_OF_TABLE;
        if (slot_mapping[t] < 0 || slot_mapping[t] >= num_blocks * block_size) return SLOT_OUT_OF_POOL;
    }
    for (int64_t t = 0; t < tokens; t++) {
        const float *cos = cos_sin + positions[t] * 2 * dim, *sin = cos + dim;
        for (int64_t h = 0; h < q_heads; h++) NAME(rotate_row)(q + t * token_stride + h * dim, cos, sin, dim, q_out + (t * q_heads + h) * dim);
        int64_t slot = slot_mapping[t];
        int64_t place = (slot / block_size) * block_stride + (slot % block_size) * position_stride;
        for (int64_t h = 0; h < kv_heads; h++) {
            NAME(rotate_row)(k + t * token_stride + h * dim, cos, sin, dim, key_cache + place + h * head_stride);
            memcpy(value_cache + place + h * head_stride, v + t * token_stride + h * dim, sizeof(ELEMENT) * (size_t)dim);
        }
    }
    return OK;
}

/* SiLU(gate) * up of each row of gate_up ([rows, 2 * width], packed): SiLU in float32 rounded, the product
rounded (reference.silu_and_mul's arithmetic). */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void NAME(kvf_silu_and_mul)(const ELEMENT *gate_up, ELEMENT *out, int64_t rows, int64_t width) {
    float activated[256];  /* a chunk of the row's SiLU: two plain loops, each of which gcc vectorizes */
    for (int64_t r = 0; r < rows; r++) {
        const ELEMENT *gate = gate_up + r * 2 * width, *up = gate + width;
        ELEMENT *target = out + r * width;
        for (int64_t start = 0; start < width; start += 256) {
            int64_t count = width - start < 256 ? width - start : 256;
#pragma omp simd
            for (int64_t i = 0; i < count; i++) {
                float g = TO_FLOAT(gate[start + i]);
                activated[i] = ROUNDED(g / (1.0f + exp_vectorizable(-g)));
            }
            for (int64_t i = 0; i < count; i++)
                target[start + i] = FROM_FLOAT(activated[i] * TO_FLOAT(up[start + i]));
        }
    }
}
