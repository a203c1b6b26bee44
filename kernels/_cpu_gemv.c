/* Linear layers of the CPU's decode step, x @ W.T for a few rows (a decode batch: 1 to a few hundred),
bfloat16 or float32, or int8 weights with one float32 scale per output against bfloat16 or float32 rows,
reading each weight byte once from memory at close to its bandwidth on every core torch uses. No Python
header: loaded with ctypes (kernels/cpu_gemv.py).

Weights are packed once (cpu_gemv.py) into tiles of TILE outputs: bfloat16 as [tiles][ceil(K/2)][TILE][2],
each k pair of a tile's outputs side by side, as AVX-512 BF16's dot product of pairs takes them; float32 as
[tiles][K][TILE]; int8 as [tiles][K'/4][TILE][4] with K' = K rounded up to QUANT_BLOCK, each k quad side by
side as AVX-512 VNNI's byte dot product takes them, and stored as unsigned bytes, value + 128 (the instruction
multiplies unsigned bytes by signed ones). A tile is one contiguous stream; the rows' accumulators of a tile
(ROW_BLOCK rows of TILE lanes) stay in registers while it streams, the rows' inputs broadcast from memory;
more rows than ROW_BLOCK go through the tile again, from the core's L2 cache. Zero padding past N and K adds
nothing.

Threads: the tiles are split evenly between the threads of an OpenMP parallel region (32 outputs a tile so
that SmolLM2's 576 outputs make 18 tiles, even on two threads; tiles of 64 left one thread a ninth more). torch's wheels load
their own libgomp under the soname libgomp.so.1, and this library, loaded after torch, binds to that same
one: the region runs on torch's own worker threads, which spin a while after each of torch's parallel ops
(and each of these calls), so there is no second pool to oversubscribe the cores and a call costs a couple
of microseconds of fork and join.

Arithmetic: bfloat16 and float32, each output a float32 sum of its K products in k order (bfloat16: a pair's
two products at a time, exact in float32), the bias added, bfloat16 outputs rounded to nearest even as torch
rounds. int8, as llama.cpp multiplies its Q8_0 weights: each row's activations are quantized once a call in
blocks of QUANT_BLOCK, to int8 values (round to nearest even) on the block's own scale (its largest magnitude
/ 127); a block's products are an exact integer sum, which times the block's scale is added into the output's
float32 sum in block order, and that sum times the output's scale, plus the bias, is the output. A row's outputs
depend on that row alone: the same bits in any batch and on any thread count. AVX-512 BF16's dot product
treats subnormal inputs and sums as zero (Intel's definition of the instruction), far below any weight or
activation of a model.
*/
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_cpu_bf16_bits.h"

#define TILE 32
#define ROW_BLOCK 8
#define QUANT_BLOCK 32  /* activations a scale, for int8 weights (llama.cpp's Q8_0 block) */
#define BF16_TARGET "avx512f,avx512bw,avx512vl,avx512bf16"
#define VNNI_TARGET "avx512f,avx512bw,avx512vnni"
/* The vector kernels ask for the weights this many bytes ahead of their reads, into L2: a decode step is 121
calls of 0.3-3.5 MB each, and at each call's start the hardware's prefetcher had not yet found the stream;
121 bfloat16 calls of SmolLM2's shapes took 5-9% less time with it (4 KB; 1 KB into L1 was slower). */
#define PREFETCH_AHEAD 4096

/* A call's rows quantized for int8 weights (see the top), from `source` ([rows, k], bfloat16 where `bf16`, else
float32): per row, its padded_k int8 values, and per block its scale and 128 times its values' sum (what the
weights' +128 adds to the block's integer sum). */
struct quantized_rows {
    const void *source;
    int bf16;
    int8_t *values;   /* [rows][padded_k], zeros past k */
    float *scales;    /* [rows][blocks] */
    int32_t *offsets; /* [rows][blocks] */
    int64_t padded_k, blocks;
};

/* One call's operands. x: [rows, k] packed (NULL for int8 weights, whose rows are `quantized`); out: [rows, n]
packed; bias: [n] or NULL; scales: int8 weights' [n] float32 scales, NULL for the others. */
struct linear_call {
    const void *x, *packed, *bias;
    const float *scales;
    const struct quantized_rows *quantized;
    void *out;
    int64_t rows, k, n;
};

/* The sums of `rows` (<= ROW_BLOCK) rows for one tile, sums[r][j] for output tile * TILE + j. */
typedef void tile_kernel(const struct linear_call *call, int64_t tile, int64_t first_row, int rows,
                         float sums[ROW_BLOCK][TILE]);

/* kernel(args..., rows, sums) with `rows` (1 to ROW_BLOCK) a constant in each case: inlined, the rows'
accumulators become registers. */
#define WITH_CONSTANT_ROWS(rows, kernel, ...)                      \
    switch (rows) {                                                \
    case 1: kernel(__VA_ARGS__, 1, sums); break;                   \
    case 2: kernel(__VA_ARGS__, 2, sums); break;                   \
    case 3: kernel(__VA_ARGS__, 3, sums); break;                   \
    case 4: kernel(__VA_ARGS__, 4, sums); break;                   \
    case 5: kernel(__VA_ARGS__, 5, sums); break;                   \
    case 6: kernel(__VA_ARGS__, 6, sums); break;                   \
    case 7: kernel(__VA_ARGS__, 7, sums); break;                   \
    default: kernel(__VA_ARGS__, 8, sums); break;                  \
    }

/* The two cache lines (a step's 128 bytes of weights) PREFETCH_AHEAD bytes on; a prefetch past the end of the
weights does not fault. */
static inline __attribute__((always_inline)) void prefetch_ahead(const void *step) {
    _mm_prefetch((const char *)step + PREFETCH_AHEAD, _MM_HINT_T1);
    _mm_prefetch((const char *)step + PREFETCH_AHEAD + 64, _MM_HINT_T1);
}

/* ---- bfloat16: AVX-512 BF16 ---- */

static inline __attribute__((always_inline, target(BF16_TARGET))) void bf16_tile_avx512_rows(
    const uint16_t *x, int64_t k, const uint16_t *weights, const int rows, float sums[ROW_BLOCK][TILE]) {
    __m512 low[ROW_BLOCK], high[ROW_BLOCK];
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) low[r] = high[r] = _mm512_setzero_ps();
    int64_t pairs = k / 2;
    for (int64_t p = 0; p < pairs; p++) {
        prefetch_ahead(weights + p * 2 * TILE);
        __m512bh first = (__m512bh)_mm512_loadu_si512(weights + p * 2 * TILE);
        __m512bh second = (__m512bh)_mm512_loadu_si512(weights + p * 2 * TILE + TILE);
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {
            int32_t pair;
            memcpy(&pair, x + r * k + 2 * p, sizeof pair);
            __m512bh both = (__m512bh)_mm512_set1_epi32(pair);
            low[r] = _mm512_dpbf16_ps(low[r], both, first);
            high[r] = _mm512_dpbf16_ps(high[r], both, second);
        }
    }
    if (k % 2) {  /* the last k alone, its pair's other half zero (x's next element is another row's) */
        __m512bh first = (__m512bh)_mm512_loadu_si512(weights + pairs * 2 * TILE);
        __m512bh second = (__m512bh)_mm512_loadu_si512(weights + pairs * 2 * TILE + TILE);
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {
            __m512bh last = (__m512bh)_mm512_set1_epi32(x[r * k + k - 1]);
            low[r] = _mm512_dpbf16_ps(low[r], last, first);
            high[r] = _mm512_dpbf16_ps(high[r], last, second);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) {
        _mm512_storeu_ps(sums[r], low[r]);
        _mm512_storeu_ps(sums[r] + 16, high[r]);
    }
}

__attribute__((target(BF16_TARGET))) static void bf16_tile_avx512(const struct linear_call *call, int64_t tile,
                                                                   int64_t first_row, int rows,
                                                                   float sums[ROW_BLOCK][TILE]) {
    const uint16_t *x = (const uint16_t *)call->x + first_row * call->k;
    const uint16_t *weights = (const uint16_t *)call->packed + tile * ((call->k + 1) / 2) * 2 * TILE;
    WITH_CONSTANT_ROWS(rows, bf16_tile_avx512_rows, x, call->k, weights)
}

/* ---- float32: AVX-512 ---- */

static inline __attribute__((always_inline, target("avx512f"))) void f32_tile_avx512_rows(
    const float *x, int64_t k, const float *weights, const int rows, float sums[ROW_BLOCK][TILE]) {
    __m512 low[ROW_BLOCK], high[ROW_BLOCK];
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) low[r] = high[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i++) {
        prefetch_ahead(weights + i * TILE);  /* a step's 128 bytes */
        __m512 first = _mm512_loadu_ps(weights + i * TILE), second = _mm512_loadu_ps(weights + i * TILE + 16);
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {
            __m512 value = _mm512_set1_ps(x[r * k + i]);
            low[r] = _mm512_fmadd_ps(value, first, low[r]);
            high[r] = _mm512_fmadd_ps(value, second, high[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) {
        _mm512_storeu_ps(sums[r], low[r]);
        _mm512_storeu_ps(sums[r] + 16, high[r]);
    }
}

__attribute__((target("avx512f"))) static void f32_tile_avx512(const struct linear_call *call, int64_t tile,
                                                              int64_t first_row, int rows,
                                                              float sums[ROW_BLOCK][TILE]) {
    const float *x = (const float *)call->x + first_row * call->k;
    const float *weights = (const float *)call->packed + tile * call->k * TILE;
    WITH_CONSTANT_ROWS(rows, f32_tile_avx512_rows, x, call->k, weights)
}

/* ---- int8 weights against quantized rows: AVX-512 VNNI ---- */

static inline __attribute__((always_inline, target(VNNI_TARGET))) void int8_tile_vnni_rows(
    const struct quantized_rows *quantized, int64_t first_row, const uint8_t *weights, const int rows,
    float sums[ROW_BLOCK][TILE]) {
    int64_t padded_k = quantized->padded_k, blocks = quantized->blocks;
    /* The float32 totals live in `sums` (L1), touched once a block: in registers beside the integer sums they
    were 32 vectors for 8 rows, and spilled. */
    memset(sums, 0, sizeof(float) * ROW_BLOCK * TILE);
    for (int64_t b = 0; b < blocks; b++) {
        __m512i low[ROW_BLOCK], high[ROW_BLOCK];
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++) low[r] = high[r] = _mm512_setzero_si512();
        const uint8_t *block = weights + b * QUANT_BLOCK * TILE;
#pragma GCC unroll 8
        for (int q = 0; q < QUANT_BLOCK / 4; q++) {  /* a quad step: 4 k of TILE outputs, 128 bytes */
            prefetch_ahead(block + q * 4 * TILE);
            __m512i first = _mm512_loadu_si512(block + q * 4 * TILE);
            __m512i second = _mm512_loadu_si512(block + q * 4 * TILE + 64);
#pragma GCC unroll 8
            for (int r = 0; r < rows; r++) {
                int32_t four;
                memcpy(&four, quantized->values + (first_row + r) * padded_k + b * QUANT_BLOCK + q * 4, sizeof four);
                __m512i values = _mm512_set1_epi32(four);
                low[r] = _mm512_dpbusd_epi32(low[r], first, values);
                high[r] = _mm512_dpbusd_epi32(high[r], second, values);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {
            int64_t at = (first_row + r) * blocks + b;
            __m512i offset = _mm512_set1_epi32(quantized->offsets[at]);
            __m512 scale = _mm512_set1_ps(quantized->scales[at]);
            __m512 low_sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(low[r], offset));
            __m512 high_sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(high[r], offset));
            _mm512_storeu_ps(sums[r], _mm512_fmadd_ps(low_sum, scale, _mm512_loadu_ps(sums[r])));
            _mm512_storeu_ps(sums[r] + 16, _mm512_fmadd_ps(high_sum, scale, _mm512_loadu_ps(sums[r] + 16)));
        }
    }
}

__attribute__((target(VNNI_TARGET))) static void int8_tile_vnni(const struct linear_call *call, int64_t tile,
                                                                int64_t first_row, int rows,
                                                                float sums[ROW_BLOCK][TILE]) {
    const uint8_t *weights = (const uint8_t *)call->packed + tile * call->quantized->padded_k * TILE;
    WITH_CONSTANT_ROWS(rows, int8_tile_vnni_rows, call->quantized, first_row, weights)
}

/* ---- plain C, one row at a time (the compiler vectorizes the TILE lanes) ---- */

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
static void bf16_tile_portable(const struct linear_call *call, int64_t tile, int64_t first_row, int rows,
                               float sums[ROW_BLOCK][TILE]) {
    int64_t k = call->k, pairs = (k + 1) / 2;
    const uint16_t *weights = (const uint16_t *)call->packed + tile * pairs * 2 * TILE;
    for (int r = 0; r < rows; r++) {
        const uint16_t *x = (const uint16_t *)call->x + (first_row + r) * k;
        float *sum = sums[r];
        memset(sum, 0, sizeof(float) * TILE);
        for (int64_t p = 0; p < pairs; p++) {
            float first = bf16_to_float(x[2 * p]), second = 2 * p + 1 < k ? bf16_to_float(x[2 * p + 1]) : 0.0f;
            const uint16_t *pair = weights + p * 2 * TILE;
#pragma omp simd
            for (int j = 0; j < TILE; j++) sum[j] += first * bf16_to_float(pair[2 * j]) + second * bf16_to_float(pair[2 * j + 1]);
        }
    }
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
static void f32_tile_portable(const struct linear_call *call, int64_t tile, int64_t first_row, int rows,
                              float sums[ROW_BLOCK][TILE]) {
    int64_t k = call->k;
    const float *weights = (const float *)call->packed + tile * k * TILE;
    for (int r = 0; r < rows; r++) {
        const float *x = (const float *)call->x + (first_row + r) * k;
        float sum[TILE] = {0};
        for (int64_t i = 0; i < k; i++) {
#pragma omp simd
            for (int j = 0; j < TILE; j++) sum[j] += x[i] * weights[i * TILE + j];
        }
        memcpy(sums[r], sum, sizeof sum);
    }
}

/* The VNNI kernel's arithmetic in plain C: integer sums a block, the same float32 steps in the same order. */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
static void int8_tile_portable(const struct linear_call *call, int64_t tile, int64_t first_row, int rows,
                               float sums[ROW_BLOCK][TILE]) {
    const struct quantized_rows *quantized = call->quantized;
    int64_t padded_k = quantized->padded_k, blocks = quantized->blocks;
    const uint8_t *weights = (const uint8_t *)call->packed + tile * padded_k * TILE;
    for (int r = 0; r < rows; r++) {
        int64_t row = first_row + r;
        const int8_t *values = quantized->values + row * padded_k;
        float total[TILE] = {0};
        for (int64_t b = 0; b < blocks; b++) {
            int32_t dots[TILE] = {0};
            for (int64_t i = b * QUANT_BLOCK; i < (b + 1) * QUANT_BLOCK; i++) {
                const uint8_t *quad = weights + (i / 4) * 4 * TILE + i % 4;  /* output j's byte at quad[4 * j] */
                int32_t value = values[i];
#pragma omp simd
                for (int j = 0; j < TILE; j++) dots[j] += (int32_t)quad[4 * j] * value;
            }
            int32_t offset = quantized->offsets[row * blocks + b];
            float scale = quantized->scales[row * blocks + b];
#pragma omp simd
            for (int j = 0; j < TILE; j++) total[j] = __builtin_fmaf((float)(dots[j] - offset), scale, total[j]);
        }
        memcpy(sums[r], total, sizeof total);
    }
}

/* Room for a call's rows quantized (see the top); 0 where there is none (nothing allocated). */
static int allocate_quantized(const void *source, int bf16, int64_t rows, int64_t k,
                              struct quantized_rows *quantized) {
    int64_t blocks = (k + QUANT_BLOCK - 1) / QUANT_BLOCK, padded_k = blocks * QUANT_BLOCK;
    int8_t *values = calloc((size_t)(rows * padded_k), 1);
    float *scales = malloc(sizeof(float) * (size_t)(rows * blocks));
    int32_t *offsets = malloc(sizeof(int32_t) * (size_t)(rows * blocks));
    if (!values || !scales || !offsets) {
        free(values), free(scales), free(offsets);
        return 0;
    }
    *quantized = (struct quantized_rows){source, bf16, values, scales, offsets, padded_k, blocks};
    return 1;
}

/* Row r of the source [rows, k] quantized block by block (see the top). */
static void quantize_row(const struct quantized_rows *quantized, int64_t r, int64_t k) {
    const void *x = quantized->source;
    int bf16 = quantized->bf16;
    int64_t blocks = quantized->blocks, padded_k = quantized->padded_k;
    for (int64_t b = 0; b < blocks; b++) {
        float block[QUANT_BLOCK] = {0}, largest = 0.0f;
        int64_t count = k - b * QUANT_BLOCK < QUANT_BLOCK ? k - b * QUANT_BLOCK : QUANT_BLOCK;
        for (int64_t i = 0; i < count; i++) {
            int64_t at = r * k + b * QUANT_BLOCK + i;
            block[i] = bf16 ? bf16_to_float(((const uint16_t *)x)[at]) : ((const float *)x)[at];
            float magnitude = block[i] < 0 ? -block[i] : block[i];
            largest = magnitude > largest ? magnitude : largest;
        }
        float scale = largest / 127.0f, inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
        int32_t sum = 0;
        for (int64_t i = 0; i < count; i++) {
            int32_t value = (int32_t)__builtin_nearbyintf(block[i] * inverse);  /* ties to even */
            quantized->values[r * padded_k + b * QUANT_BLOCK + i] = (int8_t)value;
            sum += value;
        }
        quantized->scales[r * blocks + b] = scale;
        quantized->offsets[r * blocks + b] = 128 * sum;
    }
}

/* ---- the tiles of one thread's share, and the threads ---- */

/* The stores: each sum times its output's scale where there are scales (times 1 is exact), plus the bias. */
static void bf16_store(const struct linear_call *call, int64_t tile, int64_t first_row, int rows,
                       float sums[ROW_BLOCK][TILE]) {
    int64_t start = tile * TILE, count = call->n - start < TILE ? call->n - start : TILE;
    const uint16_t *bias = call->bias;
    const float *scales = call->scales;
    for (int r = 0; r < rows; r++) {
        uint16_t *target = (uint16_t *)call->out + (first_row + r) * call->n + start;
        for (int64_t j = 0; j < count; j++)
            target[j] = float_to_bf16(sums[r][j] * (scales ? scales[start + j] : 1.0f)
                                      + (bias ? bf16_to_float(bias[start + j]) : 0.0f));
    }
}

static void f32_store(const struct linear_call *call, int64_t tile, int64_t first_row, int rows,
                      float sums[ROW_BLOCK][TILE]) {
    int64_t start = tile * TILE, count = call->n - start < TILE ? call->n - start : TILE;
    const float *bias = call->bias, *scales = call->scales;
    for (int r = 0; r < rows; r++) {
        float *target = (float *)call->out + (first_row + r) * call->n + start;
        for (int64_t j = 0; j < count; j++)
            target[j] = sums[r][j] * (scales ? scales[start + j] : 1.0f) + (bias ? bias[start + j] : 0.0f);
    }
}

typedef void tile_store(const struct linear_call *call, int64_t tile, int64_t first_row, int rows,
                        float sums[ROW_BLOCK][TILE]);

static void run_tiles(const struct linear_call *call, tile_kernel *kernel, tile_store *store, int64_t first,
                      int64_t last) {
    float sums[ROW_BLOCK][TILE];
    for (int64_t tile = first; tile < last; tile++)
        for (int64_t row = 0; row < call->rows; row += ROW_BLOCK) {
            int rows = call->rows - row < ROW_BLOCK ? (int)(call->rows - row) : ROW_BLOCK;
            kernel(call, tile, row, rows, sums);
            store(call, tile, row, rows, sums);
        }
}

/* The tiles split between the threads; int8 weights' rows quantized first in the same region. */
static void run(const struct linear_call *call, tile_kernel *kernel, tile_store *store, int threads) {
    int64_t tiles = (call->n + TILE - 1) / TILE;
#pragma omp parallel num_threads(threads) if (threads > 1 && tiles > 1)
    {
        if (call->quantized) {  /* every thread or none: the rows split between them, then a barrier */
#pragma omp for schedule(static)
            for (int64_t r = 0; r < call->rows; r++) quantize_row(call->quantized, r, call->k);
        }
        int64_t thread = omp_get_thread_num(), count = omp_get_num_threads();
        run_tiles(call, kernel, store, tiles * thread / count, tiles * (thread + 1) / count);
    }
}

/* ---- entry points ---- */

/* Whether this CPU runs the kernel written for its vector instructions for weights of `kind` (0 float32:
AVX-512; 1 bfloat16: AVX-512 BF16; 2 int8: AVX-512 VNNI), else the plain C one does. */
int kvf_linear_has_vector_kernel(int kind) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) return 0;
    if (kind == 1)
        return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw")
               && __builtin_cpu_supports("avx512vl");
    return kind != 2 || (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw"));
}

/* out = x @ W.T + bias in bfloat16, W packed (see the top); `portable` takes the plain C kernel (tests). */
void kvf_linear_bf16(const uint16_t *x, const uint16_t *packed, const uint16_t *bias, uint16_t *out, int64_t rows,
                     int64_t k, int64_t n, int threads, int portable) {
    static int vector = -1;
    if (vector < 0) vector = kvf_linear_has_vector_kernel(1);
    struct linear_call call = {x, packed, bias, NULL, NULL, out, rows, k, n};
    run(&call, vector && !portable ? bf16_tile_avx512 : bf16_tile_portable, bf16_store, threads);
}

/* out = x @ W.T + bias in float32, W packed (see the top); `portable` as above. */
void kvf_linear_f32(const float *x, const float *packed, const float *bias, float *out, int64_t rows, int64_t k,
                    int64_t n, int threads, int portable) {
    static int vector = -1;
    if (vector < 0) vector = kvf_linear_has_vector_kernel(0);
    struct linear_call call = {x, packed, bias, NULL, NULL, out, rows, k, n};
    run(&call, vector && !portable ? f32_tile_avx512 : f32_tile_portable, f32_store, threads);
}

/* out = (x @ Q.T) * scales + bias for int8 weights Q packed (see the top) with one float32 scale an output, x
and out (and bias) bfloat16 (`bf16`) or float32; the rows are quantized once, by the threads that then run
the tiles, into buffers they share. Returns 0, or -1 where those buffers cannot be had (nothing written). */
int kvf_linear_int8(const void *x, const uint8_t *packed, const float *scales, const void *bias, void *out,
                    int64_t rows, int64_t k, int64_t n, int threads, int portable, int bf16) {
    static int vector = -1;
    if (vector < 0) vector = kvf_linear_has_vector_kernel(2);
    struct quantized_rows quantized;
    if (!allocate_quantized(x, bf16, rows, k, &quantized)) return -1;
    struct linear_call call = {NULL, packed, bias, scales, &quantized, out, rows, k, n};
    run(&call, vector && !portable ? int8_tile_vnni : int8_tile_portable, bf16 ? bf16_store : f32_store, threads);
    free(quantized.values), free(quantized.scales), free(quantized.offsets);
    return 0;
}
