/* lib/util/rng.c's counter-based generator on the device, bit for bit: the same
 * mix (splitmix64's finaliser) chained over (seed, stream, a, b, c), and the
 * same 24-bit uniform. tests/test_cuda.c compares a table of keys with
 * lib/util/rng.c. Keep the two in step. */
#ifndef DP_CUDA_RNG_CUH
#define DP_CUDA_RNG_CUH

#include <stdint.h>

__device__ __forceinline__ uint64_t dp_d_mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ uint64_t dp_d_rng_u64(uint64_t seed, uint64_t stream, uint64_t a,
                                                 uint64_t b, uint64_t c) {
  return dp_d_mix(dp_d_mix(dp_d_mix(dp_d_mix(dp_d_mix(seed) ^ stream) ^ a) ^ b) ^ c);
}

/* Uniform in [0, 1): the top 24 bits (exact in a float) times 2^-24 (exact). */
__device__ __forceinline__ float dp_d_rng_uniform(uint64_t seed, uint64_t stream,
                                                  uint64_t a, uint64_t b, uint64_t c) {
  return (float)(uint32_t)(dp_d_rng_u64(seed, stream, a, b, c) >> 40) * 0x1p-24f;
}

#endif
