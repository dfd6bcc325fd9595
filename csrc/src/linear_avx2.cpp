// The linear kernels compiled for AVX2 + FMA (selected at run time; the rest
// of the build assumes no more than the baseline x86-64 ISA). See linear.h for
// the two shapes of work.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "linear.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

namespace lc::linear {
namespace {

// Loops over register-resident arrays are unrolled early, so that the arrays become
// registers (otherwise GCC keeps a memory copy of the accumulators, updated every k).
#if defined(__clang__)
#define LC_UNROLL _Pragma("unroll")
#else
#define LC_UNROLL _Pragma("GCC unroll 16")
#endif

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
// bf16 bits -> fp32: widen to 32 bits and shift into the high half.
inline __m256 load8(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float widen(float v) { return v; }
inline float widen(uint16_t v) { return bf16_to_f32(v); }

// The lane sums of four vectors, in order.
inline __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

// ---- small M: dot products of R x rows with a tile of 4 W rows -----------------
constexpr int kDotRows = 4;  // x rows per pass: 4 x 4 accumulators + 4 weights in registers
constexpr int kDotCols = 4;  // W rows per tile

template <int R, class WT>
void dot_tile(const Job& job, const WT* w, int64_t m0, int64_t n0, int64_t nvalid) {
    const int64_t K = job.K, K8 = K & ~int64_t(7);
    const WT* wr[kDotCols];
    // A short last tile repeats its last row; the extra results are not stored.
    LC_UNROLL
    for (int c = 0; c < kDotCols; ++c) wr[c] = w + (n0 + std::min<int64_t>(c, nvalid - 1)) * K;
    const float* xr[R];
    LC_UNROLL
    for (int r = 0; r < R; ++r) xr[r] = job.x + (m0 + r) * job.ldx;
    __m256 acc[R][kDotCols];
    LC_UNROLL
    for (int r = 0; r < R; ++r)
        LC_UNROLL
        for (int c = 0; c < kDotCols; ++c) acc[r][c] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K8; k += 8) {
        __m256 wv[kDotCols];
        LC_UNROLL
        for (int c = 0; c < kDotCols; ++c) wv[c] = load8(wr[c] + k);
        LC_UNROLL
        for (int r = 0; r < R; ++r) {
            const __m256 xv = _mm256_loadu_ps(xr[r] + k);
            LC_UNROLL
            for (int c = 0; c < kDotCols; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    LC_UNROLL
    for (int r = 0; r < R; ++r) {
        alignas(16) float v[kDotCols] = {};
        _mm_store_ps(v, hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
        for (int64_t k = K8; k < K; ++k)
            LC_UNROLL
            for (int c = 0; c < kDotCols; ++c) v[c] += xr[r][k] * widen(wr[c][k]);
        store_row(job, m0 + r, n0, v, std::min<int64_t>(nvalid, kDotCols));
    }
}

template <class WT>
void run_small(const Job& job) {
    const WT* w = static_cast<const WT*>(job.w);
    const int64_t tiles = (job.N + kDotCols - 1) / kDotCols;
    for_tiles(job, tiles, job.M * job.K * kDotCols, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
            const int64_t n0 = t * kDotCols, nvalid = std::min<int64_t>(kDotCols, job.N - n0);
            // The tile stays in L1 while every block of rows passes over it.
            for (int64_t m0 = 0; m0 < job.M; m0 += kDotRows) {
                switch (std::min<int64_t>(kDotRows, job.M - m0)) {
                    case 1: dot_tile<1>(job, w, m0, n0, nvalid); break;
                    case 2: dot_tile<2>(job, w, m0, n0, nvalid); break;
                    case 3: dot_tile<3>(job, w, m0, n0, nvalid); break;
                    default: dot_tile<4>(job, w, m0, n0, nvalid); break;
                }
            }
        }
    });
}

// ---- large M: packed panels and a 6x16 microkernel -----------------------------
constexpr int kNR = 16;                  // columns per panel (two vectors)
constexpr int kMR = 6;                   // x rows per microkernel: 12 accumulators
constexpr int64_t kPackBytes = 160 << 10;  // packed panels kept per thread (L2-resident)

inline void transpose8(__m256 r[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// dst[k][c] = W[n0 + c][k] as fp32 for c < 16; columns past nvalid are zero.
template <class WT>
void pack_panel(const WT* w, int64_t K, int64_t n0, int64_t nvalid, float* dst) {
    const int64_t K8 = K & ~int64_t(7);
    for (int h = 0; h < kNR / 8; ++h) {
        const WT* rows[8];
        bool live[8];
        LC_UNROLL
        for (int i = 0; i < 8; ++i) {
            const int64_t c = h * 8 + i;
            live[i] = c < nvalid;
            rows[i] = w + (n0 + (live[i] ? c : 0)) * K;
        }
        for (int64_t k = 0; k < K8; k += 8) {
            __m256 r[8];
            LC_UNROLL
            for (int i = 0; i < 8; ++i) r[i] = live[i] ? load8(rows[i] + k) : _mm256_setzero_ps();
            transpose8(r);
            LC_UNROLL
            for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + (k + i) * kNR + h * 8, r[i]);
        }
        for (int64_t k = K8; k < K; ++k)
            LC_UNROLL
            for (int i = 0; i < 8; ++i)
                dst[k * kNR + h * 8 + i] = live[i] ? widen(rows[i][k]) : 0.0f;
    }
}

template <int R>
void micro(const Job& job, const float* panel, int64_t m0, int64_t n0, int64_t nvalid) {
    const int64_t K = job.K;
    const float* xr[R];
    LC_UNROLL
    for (int r = 0; r < R; ++r) xr[r] = job.x + (m0 + r) * job.ldx;
    __m256 c0[R], c1[R];
    LC_UNROLL
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm256_setzero_ps();
    const float* b = panel;
    for (int64_t k = 0; k < K; ++k, b += kNR) {
        const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        LC_UNROLL
        for (int r = 0; r < R; ++r) {
            const __m256 a = _mm256_broadcast_ss(xr[r] + k);
            c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
        }
    }
    if (job.out_dtype == LC_DTYPE_F32 && nvalid == kNR) {
        __m256 bias0 = _mm256_setzero_ps(), bias1 = _mm256_setzero_ps();
        if (job.bias) {
            bias0 = _mm256_loadu_ps(job.bias + n0);
            bias1 = _mm256_loadu_ps(job.bias + n0 + 8);
        }
        LC_UNROLL
        for (int r = 0; r < R; ++r) {
            float* o = static_cast<float*>(job.out) + (m0 + r) * job.ldo + n0;
            _mm256_storeu_ps(o, _mm256_add_ps(c0[r], bias0));
            _mm256_storeu_ps(o + 8, _mm256_add_ps(c1[r], bias1));
        }
        return;
    }
    LC_UNROLL
    for (int r = 0; r < R; ++r) {
        float v[kNR];
        _mm256_storeu_ps(v, c0[r]);
        _mm256_storeu_ps(v + 8, c1[r]);
        store_row(job, m0 + r, n0, v, nvalid);
    }
}

template <class WT>
void run_large(const Job& job) {
    const WT* w = static_cast<const WT*>(job.w);
    const int64_t panels = (job.N + kNR - 1) / kNR, K = job.K;
    const int64_t per_panel = std::max<int64_t>(1, K) * kNR;
    const int64_t group = std::clamp<int64_t>(kPackBytes / (per_panel * 4), 1, 8);
    for_tiles(job, panels, job.M * K * kNR, [&](int64_t p0, int64_t p1) {
        thread_local std::vector<float> buf;
        if (int64_t(buf.size()) < group * per_panel) buf.resize(size_t(group * per_panel));
        for (int64_t g0 = p0; g0 < p1; g0 += group) {
            const int64_t gn = std::min(group, p1 - g0);
            for (int64_t j = 0; j < gn; ++j) {
                const int64_t n0 = (g0 + j) * kNR;
                pack_panel(w, K, n0, std::min<int64_t>(kNR, job.N - n0), buf.data() + j * per_panel);
            }
            // A block of x rows stays in L1 while it passes over the group's panels.
            for (int64_t m0 = 0; m0 < job.M; m0 += kMR) {
                const int64_t rows = std::min<int64_t>(kMR, job.M - m0);
                for (int64_t j = 0; j < gn; ++j) {
                    const int64_t n0 = (g0 + j) * kNR, nvalid = std::min<int64_t>(kNR, job.N - n0);
                    const float* panel = buf.data() + j * per_panel;
                    switch (rows) {
                        case 1: micro<1>(job, panel, m0, n0, nvalid); break;
                        case 2: micro<2>(job, panel, m0, n0, nvalid); break;
                        case 3: micro<3>(job, panel, m0, n0, nvalid); break;
                        case 4: micro<4>(job, panel, m0, n0, nvalid); break;
                        case 5: micro<5>(job, panel, m0, n0, nvalid); break;
                        default: micro<6>(job, panel, m0, n0, nvalid); break;
                    }
                }
            }
        }
    });
}

template <class WT>
void run_typed(const Job& job) {
    if (job.M <= kSmallM)
        run_small<WT>(job);
    else
        run_large<WT>(job);
}

}  // namespace

void run_avx2(const Job& job) {
    if (job.w_dtype == LC_DTYPE_BF16)
        run_typed<uint16_t>(job);
    else
        run_typed<float>(job);
}

}  // namespace lc::linear

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else  // not x86: never selected (best_isa() reports scalar)

namespace lc::linear {
void run_avx2(const Job&) { fail(LC_ERR_INTERNAL, "AVX2 linear kernel called on a non-x86 build"); }
}  // namespace lc::linear

#endif
