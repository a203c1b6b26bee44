/* The CPU's decode-step kernels, float32 and bfloat16, each one C call where torch took several op calls, a
fixed cost each that a small model's step pays thirty times a token: paged decode attention, RMSNorm with its
residual add, RoPE with the KV store, SiLU-and-mul. No Python header: loaded with ctypes
(kernels/cpu_decode.py). target_clones builds an x86-64-v4 (AVX-512), an x86-64-v3 (AVX2, FMA) and a
baseline copy of each kernel; the loader picks the CPU's at load time. The kernels are written once
(_cpu_decode_kernels.h) and included here for each type, named with its suffix (_f32, _bf16).

Arithmetic: as torch computes these ops, in float32, bfloat16's rounded (to nearest even) where torch's op
ends, so RoPE and the residual add are bit for bit kernels/reference.py's; RMSNorm and the attention's
softmax differ from it only in the order of float32 sums and in float32's last bits of e^x (a polynomial
here, torch's own vectorized one there), SiLU in the latter. RoPE's products and sum are never fused into one
multiply-add, which would change float32's bits (rotate_row). Each row's result depends on its own inputs
alone: a token's output is the same in any batch.
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

#define ROUNDED(f) TO_FLOAT(FROM_FLOAT(f))

#define ELEMENT float
#define TO_FLOAT(v) (v)
#define FROM_FLOAT(f) (f)
#define NAME(base) base##_f32
#include "_cpu_decode_kernels.h"
#undef ELEMENT
#undef TO_FLOAT
#undef FROM_FLOAT
#undef NAME

#define ELEMENT uint16_t
#define TO_FLOAT(v) bf16_to_float(v)
#define FROM_FLOAT(f) float_to_bf16(f)
#define NAME(base) base##_bf16
#include "_cpu_decode_kernels.h"
