// Dense per-row loops of the CPU sampler: the passes over the whole
// vocabulary. The same source (sampling_kernels_impl.h) is compiled once per
// instruction set (portable, AVX2+FMA, AVX-512) and kernels() picks the best
// one the running CPU supports (current_isa()). Everything else in the sampler touches only
// a handful of tokens per row.
//
// "Sanitized" values: NaN -> -inf (treated as masked) and +inf -> FLT_MAX, so
// that no later subtraction or exp produces a NaN.
#pragma once

#include <cstdint>

#include "runtime/cpu_isa.h"

namespace lc::sampling {

// Number of log-spaced buckets used by the top-p threshold search, and how
// many buckets cover one nat of (max_logit - logit).
constexpr int kNumBuckets = 1024;
constexpr float kBucketsPerNat = 16.0f;

// Tokens per block in the block maxima that let selection skip most of a row.
constexpr int64_t kBlockSize = 64;

struct RaceResult {
    int64_t token;  // -1 when no token passed the predicate
    float key;
};

struct Kernels {
    const char* isa;
    // dst = sanitize(src); returns max(dst) (-inf when n == 0). block_max (may be
    // null) receives the max of each block of kBlockSize values.
    float (*load_f32)(const float* src, float* dst, int64_t n, float* block_max);
    float (*load_bf16)(const uint16_t* src, float* dst, int64_t n, float* block_max);
    // x = sanitize(x / temperature) in place (temperature 1: sanitize only); returns
    // max(x); block_max as above.
    float (*scale_max)(float* x, int64_t n, float temperature, float* block_max);
    // sum of exp(x - m) with exp(-inf) = 0. m = max(x), finite.
    float (*sum_exp)(const float* x, int64_t n, float m);
    // number of i with x[i] > v.
    int64_t (*count_greater)(const float* x, int64_t n, float v);
    // x[i] = -inf where bit (i % 32) of words[i / 32] is clear.
    void (*apply_bitmask)(float* x, int64_t n, const int32_t* words);
    // mass[b] += exp(s - m) over tokens with s >= lo, b = bucket_of(m - s).
    void (*bucket_mass)(const float* s, int64_t n, float m, float lo, double* mass);
    // Exponential race over the tokens with s >= lo and (m - s) * scale < limit:
    // argmax of exp(s - m) / -log(u(seed, position, token)), ties -> lowest id.
    RaceResult (*race_dense)(const float* s, int64_t n, float m, float lo, float scale, float limit,
                             uint64_t seed, int64_t position);
};

// The bucket of a token whose scaled logit is d = m - s >= 0 below the max.
inline int bucket_of(float d) {
    const float b = d * kBucketsPerNat;
    return b < float(kNumBuckets - 1) ? int(b) : kNumBuckets - 1;
}

// The table of the instruction set in effect (current_isa()).
const Kernels& kernels();
const Kernels& kernels_portable();  // isa "scalar": baseline ISA, vector extensions
const Kernels* kernels_avx2();    // nullptr when not compiled in
const Kernels* kernels_avx512();  // nullptr when not compiled in

// As lc::attn's: the best the CPU runs and the build compiled, a cap for
// tests, and the one in effect.
Isa best_isa();
Isa set_isa(Isa isa);
Isa current_isa();

}  // namespace lc::sampling
