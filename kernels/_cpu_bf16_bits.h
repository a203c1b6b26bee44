/* bfloat16 <-> float32 as torch converts them, for kvferry's C kernels (kernels/_cpu_decode.c, _cpu_gemv.c). */
#ifndef KVFERRY_CPU_BF16_BITS_H
#define KVFERRY_CPU_BF16_BITS_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_float(uint16_t value) {
    uint32_t bits = (uint32_t)value << 16;
    float number;
    memcpy(&number, &bits, sizeof number);
    return number;
}

/* Round to nearest, ties to even, as torch's float -> bfloat16. */
static inline uint16_t float_to_bf16(float number) {
    uint32_t bits;
    memcpy(&bits, &number, sizeof bits);
    uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    return (uint16_t)((bits & 0x7fffffffu) > 0x7f800000u ? (bits >> 16) | 0x40u : rounded);  /* NaN stays NaN */
}

#endif
