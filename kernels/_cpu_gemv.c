/* Linear layers of the CPU's decode step, x @ W.T for a few rows (a decode batch: 1 to a few hundred),
bfloat16 or float32, or int8 weights with one float32 scale per output against bfloat16 or float32 rows,
reading each weight byte once from memory at close to its bandwidth on every core torch uses. No Python
header: loaded with ctypes (kernels/cpu_gemv.py).

Weights are packed once (cpu_gemv.py) into tiles of TILE outputs: bfloat16 as [tiles][ceil(K/2)][TILE][2],
each k pair of a tile's outputs side by side, as AVX-512 BF16's dot product of pairs takes them; float32 and
int8 as [tiles][K][TILE]. A tile is one contiguous stream; the rows' accumulators of a tile (ROW_BLOCK rows of TILE
float32 lanes) stay in registers while it streams, the rows' inputs broadcast from memory; more rows than
ROW_BLOCK go through the tile again, from the core's L2 cache. Zero padding past N and K (odd K) adds nothing.

Threads: the tiles are split evenly between the threads of an OpenMP parallel region (32 outputs a tile so
that SmolLM2's 576 outputs make 18 tiles, even on two threads; tiles of 64 left one thread a ninth more). torch's wheels load
their own libgomp under the soname libgomp.so.1, and this library, loaded after torch, binds to that same
one: the region runs on torch's own worker threads, which spin a while after each of torch's parallel ops
(and each of these calls), so there is no second pool to oversubscribe the cores and a call costs a couple
of microseconds of fork and join.

Arithmetic: each output a float32 sum of its K products in k order (bfloat16: a pair's two products at a
time, exact in float32), times the output's scale (int8), the bias added, bfloat16 outputs rounded to nearest
even as torch rounds. int8 weights are widened to float32 in registers and the rows are not quantized: each
product is float32's of the row's value (bfloat16 rows widened exactly, once a call) and the integer weight. A row's
outputs depend on that row alone: the same bits in any batch and on any thread count. AVX-512 BF16's dot
product treats subnormal inputs and sums as zero (Intel's definition of the instruction), far below any
weight or activation of a model.
*/
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_cpu_bf16_bits.h"

#define TILE 32
#define ROW_BLOCK 8
#define BF16_TARGET "avx512f,avx512bw,avx512vl,avx512bf16"
/* The vector kernels ask for the weights this many bytes ahead of their reads, into L2: a decode step is 121
calls of 0.3-3.5 MB each, and at each call's start the hardware's prefetcher had not yet found the stream;
121 bfloat16 calls of SmolLM2's shapes took 5-9% less time with it (4 KB; 1 KB into L1 was slower). */
#define PREFETCH_AHEAD 4096

/* One call's operands. x: [rows, k] packed (float32 for int8 weights); out: [rows, n] packed; bias: [n] or
NULL; scales: int8 weights' [n] float32 scales, NULL for the others. */
struct linear_call {
    const void *x, *packed, *bias;
    const float *scales;
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

/* ---- float32 and int8 weights against float32 rows: AVX-512 ---- */

/* A k step's TILE weights as two vectors of 16 float32: float32 weights loaded, int8 ones widened. */
static inline __attribute__((always_inline, target("avx512f"))) void load_step(const void *weights, int int8,
                                                                              int64_t i, __m512 *first,
                                                                              __m512 *second) {
    if (int8) {
        const int8_t *step = (const int8_t *)weights + i * TILE;
        *first = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)step)));
        *second = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(step + 16))));
    } else {
        *first = _mm512_loadu_ps((const float *)weights + i * TILE);
        *second = _mm512_loadu_ps((const float *)weights + i * TILE + 16);
    }
}

static inline __attribute__((always_inline, target("avx512f"))) void float_tile_avx512_rows(
    const float *x, int64_t k, const void *weights, const int int8, const int rows, float sums[ROW_BLOCK][TILE]) {
    __m512 low[ROW_BLOCK], high[ROW_BLOCK];
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) low[r] = high[r] = _mm512_setzero_ps();
    /* prefetch_ahead covers 128 bytes: one float32 step, four int8 ones */
    const int64_t step_bytes = int8 ? TILE : TILE * (int64_t)sizeof(float), steps_a_prefetch = int8 ? 4 : 1;
    for (int64_t i = 0; i < k; i++) {
        if (i % steps_a_prefetch == 0) prefetch_ahead((const char *)weights + i * step_bytes);
        __m512 first, second;
        load_step(weights, int8, i, &first, &second);
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

static inline __attribute__((always_inline, target("avx512f"))) void float_tile_avx512(
    const struct linear_call *call, int64_t tile, int64_t first_row, int rows, float sums[ROW_BLOCK][TILE],
    const int int8) {
    const float *x = (const float *)call->x + first_row * call->k;
    const char *weights = (const char *)call->packed + tile * call->k * TILE * (int8 ? 1 : (int64_t)sizeof(float));
    WITH_CONSTANT_ROWS(rows, float_tile_avx512_rows, x, call->k, weights, int8)
}

__attribute__((target("avx512f"))) static void f32_tile_avx512(const struct linear_call *call, int64_t tile,
                                                              int64_t first_row, int rows,
                                                              float sums[ROW_BLOCK][TILE]) {
    float_tile_avx512(call, tile, first_row, rows, sums, 0);
}

__attribute__((target("avx512f"))) static void int8_tile_avx512(const struct linear_call *call, int64_t tile,
                                                               int64_t first_row, int rows,
                                                               float sums[ROW_BLOCK][TILE]) {
    float_tile_avx512(call, tile, first_row, rows, sums, 1);
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

/* float32 and int8 weights (a constant `int8` once inlined) against float32 rows. */
static inline __attribute__((always_inline)) void float_tile_portable(const struct linear_call *call, int64_t tile,
                                                                      int64_t first_row, int rows,
                                                                      float sums[ROW_BLOCK][TILE], int int8) {
    int64_t k = call->k;
    const float *float_weights = (const float *)call->packed + tile * k * TILE;
    const int8_t *int8_weights = (const int8_t *)call->packed + tile * k * TILE;
    for (int r = 0; r < rows; r++) {
        const float *x = (const float *)call->x + (first_row + r) * k;
        float sum[TILE] = {0};
        for (int64_t i = 0; i < k; i++) {
#pragma omp simd
            for (int j = 0; j < TILE; j++)
                sum[j] += x[i] * (int8 ? (float)int8_weights[i * TILE + j] : float_weights[i * TILE + j]);
        }
        memcpy(sums[r], sum, sizeof sum);
    }
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
static void f32_tile_portable(const struct linear_call *call, int64_t tile, int64_t first_row, int rows,
                              float sums[ROW_BLOCK][TILE]) {
    float_tile_portable(call, tile, first_row, rows, sums, 0);
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
static void int8_tile_portable(const struct linear_call *call, int64_t tile, int64_t first_row, int rows,
                               float sums[ROW_BLOCK][TILE]) {
    float_tile_portable(call, tile, first_row, rows, sums, 1);
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

static void run(const struct linear_call *call, tile_kernel *kernel, tile_store *store, int threads) {
    int64_t tiles = (call->n + TILE - 1) / TILE;
    if (threads <= 1 || tiles < 2) {
        run_tiles(call, kernel, store, 0, tiles);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        int64_t thread = omp_get_thread_num(), count = omp_get_num_threads();
        run_tiles(call, kernel, store, tiles * thread / count, tiles * (thread + 1) / count);
    }
}

/* ---- entry points ---- */

/* Whether this CPU runs the kernel written for its vector instructions (AVX-512 BF16 for bfloat16, AVX-512
for float32 and int8 weights), else the plain C one does. */
int kvf_linear_has_vector_kernel(int bf16) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) return 0;
    return !bf16 || (__builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw")
                     && __builtin_cpu_supports("avx512vl"));
}

/* out = x @ W.T + bias in bfloat16, W packed (see the top); `portable` takes the plain C kernel (tests). */
void kvf_linear_bf16(const uint16_t *x, const uint16_t *packed, const uint16_t *bias, uint16_t *out, int64_t rows,
                     int64_t k, int64_t n, int threads, int portable) {
    static int vector = -1;
    if (vector < 0) vector = kvf_linear_has_vector_kernel(1);
    struct linear_call call = {x, packed, bias, NULL, out, rows, k, n};
    run(&call, vector && !portable ? bf16_tile_avx512 : bf16_tile_portable, bf16_store, threads);
}

/* out = x @ W.T + bias in float32, W packed (see the top); `portable` as above. */
void kvf_linear_f32(const float *x, const float *packed, const float *bias, float *out, int64_t rows, int64_t k,
                    int64_t n, int threads, int portable) {
    static int vector = -1;
    if (vector < 0) vector = kvf_linear_has_vector_kernel(0);
    struct linear_call call = {x, packed, bias, NULL, out, rows, k, n};
    run(&call, vector && !portable ? f32_tile_avx512 : f32_tile_portable, f32_store, threads);
}

/* out = (x @ Q.T) * scales + bias for int8 weights Q packed (see the top) with one float32 scale an output, x
and out (and bias) bfloat16 (`bf16`) or float32; bfloat16 rows are widened to float32 once, into a buffer
(rows * k floats) that the threads share. Returns 0, or -1 where that buffer cannot be had (nothing written). */
int kvf_linear_int8(const void *x, const int8_t *packed, const float *scales, const void *bias, void *out,
                    int64_t rows, int64_t k, int64_t n, int threads, int portable, int bf16) {
    static int vector = -1;
    if (vector < 0) vector = kvf_linear_has_vector_kernel(0);
    float *widened = NULL;
    if (bf16) {
        widened = malloc(sizeof(float) * rows * k);
        if (!widened) return -1;
        for (int64_t i = 0; i < rows * k; i++) widened[i] = bf16_to_float(((const uint16_t *)x)[i]);
    }
    struct linear_call call = {widened ? widened : x, packed, bias, scales, out, rows, k, n};
    run(&call, vector && !portable ? int8_tile_avx512 : int8_tile_portable, bf16 ? bf16_store : f32_store, threads);
    free(widened);
    return 0;
}
