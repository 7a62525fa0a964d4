/* Counter-based random numbers (and the project's one non-cryptographic hash): a value is a pure function of its key
 * (seed, stream, a, b, c), so init and dropout do not depend on the split,
 * the device count or the order in which threads run. The definition is
 * mirrored bit for bit in tests/fixtures/golden/make_golden.py. */
#include "util/util.h"

static inline uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t dp__rng_u64(uint64_t seed, uint64_t stream, uint64_t a, uint64_t b, uint64_t c) {
  return mix(mix(mix(mix(mix(seed) ^ stream) ^ a) ^ b) ^ c);
}

float dp__rng_uniform(uint64_t seed, uint64_t stream, uint64_t a, uint64_t b, uint64_t c) {
  return (float)(dp__rng_u64(seed, stream, a, b, c) >> 40) * 0x1p-24f;
}

uint64_t dp__fnv1a(uint64_t h, const void *data, size_t n) {
  const unsigned char *b = data;
  for (size_t k = 0; k < n; k++) h = (h ^ b[k]) * 0x100000001b3ull;
  return h;
}

uint64_t dp_hash_bytes(const void *data, size_t n) {
  return n ? dp__fnv1a(DP_FNV_INIT, data, n) : DP_FNV_INIT;
}
