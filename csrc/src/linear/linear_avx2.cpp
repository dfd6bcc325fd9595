// The linear kernels compiled for AVX2 + FMA (selected at run time; the rest
// of the build assumes no more than the baseline x86-64 ISA). See linear.h for
// the two shapes of work.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/isa_target.h"
#include "linear/linear.h"

#if LC_ISA_X86
#include <immintrin.h>

LC_ISA_BEGIN("avx2,fma")

#include "common/simd_avx2.h"

namespace lc::linear {
namespace {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
// bf16 bits -> fp32: widen to 32 bits and shift into the high half.
inline __m256 load8(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float widen(float v) { return v; }
inline float widen(uint16_t v) { return bf16_to_f32(v); }

// ---- small M: one sequential stream of W rows per thread ----------------------
// Each thread walks its W rows in address order (one stream: the hardware
// prefetcher keeps up with one stream far better than with several rows read
// side by side) and prefetches kPrefetchBytes ahead. A W row is read from memory
// once and multiplied against up to kDotRows x rows (more rows: another pass
// over the row, now in L1).
constexpr int kDotRows = 4;
constexpr int64_t kPrefetchBytes = 1024;

using simd::hsum;

// res[r] = x[m0 + r] . wrow for r < R.
template <int R, class WT>
inline void dot_row(const Job& job, const WT* wrow, int64_t m0, float* res) {
    const int64_t K = job.K, K16 = K & ~int64_t(15);
    const float* xr[R];
    LC_UNROLL
    for (int r = 0; r < R; ++r) xr[r] = job.x + (m0 + r) * job.ldx;
    __m256 a0[R], a1[R];
    LC_UNROLL
    for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
    const char* pf = reinterpret_cast<const char*>(wrow) + kPrefetchBytes;
    for (int64_t k = 0; k < K16; k += 16) {
        _mm_prefetch(pf + k * int64_t(sizeof(WT)), _MM_HINT_T0);
        if (sizeof(WT) == 4) _mm_prefetch(pf + k * 4 + 32, _MM_HINT_T0);
        const __m256 w0 = load8(wrow + k), w1 = load8(wrow + k + 8);
        LC_UNROLL
        for (int r = 0; r < R; ++r) {
            a0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr[r] + k), w0, a0[r]);
            a1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr[r] + k + 8), w1, a1[r]);
        }
    }
    LC_UNROLL
    for (int r = 0; r < R; ++r) {
        float s = hsum(_mm256_add_ps(a0[r], a1[r]));
        for (int64_t k = K16; k < K; ++k) s += xr[r][k] * widen(wrow[k]);
        res[r] = s;
    }
}

template <class WT>
void run_small(const Job& job) {
    const WT* w = static_cast<const WT*>(job.w);
    for_tiles(job, job.N, job.M * job.K, [&](int64_t n0, int64_t n1) {
        // Results of this thread's columns, row by row: [M][n1 - n0].
        thread_local std::vector<float> res;
        const int64_t cols = n1 - n0;
        if (int64_t(res.size()) < job.M * cols) res.resize(size_t(job.M * cols));
        float tmp[kDotRows];
        for (int64_t n = n0; n < n1; ++n) {
            const WT* wrow = w + n * job.K;
            for (int64_t m0 = 0; m0 < job.M; m0 += kDotRows) {
                const int64_t rows = std::min<int64_t>(kDotRows, job.M - m0);
                switch (rows) {
                    case 1: dot_row<1>(job, wrow, m0, tmp); break;
                    case 2: dot_row<2>(job, wrow, m0, tmp); break;
                    case 3: dot_row<3>(job, wrow, m0, tmp); break;
                    default: dot_row<4>(job, wrow, m0, tmp); break;
                }
                for (int64_t r = 0; r < rows; ++r) res[size_t((m0 + r) * cols + (n - n0))] = tmp[r];
            }
        }
        for (int64_t m = 0; m < job.M; ++m) store_row(job, m, n0, res.data() + m * cols, cols);
    });
}

// ---- large M: packed panels and a 6x16 microkernel -----------------------------
constexpr int kNR = 16;                  // columns per panel (two vectors)
static_assert(kNR == weight::kPanel, "the packed kernels read weight.h's panels as kNR wide");
constexpr int kMR = 6;                   // x rows per microkernel: 12 accumulators
constexpr int64_t kPackBytes = 160 << 10;  // packed panels kept per thread (L2-resident)

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
            simd::transpose8(r);
            LC_UNROLL
            for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + (k + i) * kNR + h * 8, r[i]);
        }
        for (int64_t k = K8; k < K; ++k)
            LC_UNROLL
            for (int i = 0; i < 8; ++i)
                dst[k * kNR + h * 8 + i] = live[i] ? widen(rows[i][k]) : 0.0f;
    }
}

// Stores R rows x 16 columns (c0: columns 0-7, c1: 8-15) at (m0, n0), adding
// the bias; full fp32 tiles directly, the rest through store_row.
template <int R>
inline void store_tile(const Job& job, const __m256* c0, const __m256* c1, int64_t m0,
                       int64_t n0, int64_t nvalid) {
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
    store_tile<R>(job, c0, c1, m0, n0, nvalid);
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

// ---- packed W (weight.h): panels read in place ----------------------------------
// Row k of a panel as columns 0-7 (b0) and 8-15 (b1) in fp32.
inline void load_row16(const float* panel, int64_t k, __m256& b0, __m256& b1) {
    b0 = _mm256_loadu_ps(panel + k * 16);
    b1 = _mm256_loadu_ps(panel + k * 16 + 8);
}
// bf16 pair rows: each 32-bit lane holds (row 2kk, row 2kk+1) of one column, so
// row k is the lanes shifted up (even k) or masked to their high halves (odd k).
inline void load_row16(const uint16_t* panel, int64_t k, __m256& b0, __m256& b1) {
    const uint16_t* p = panel + (k >> 1) * 32;
    const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
    if (k & 1) {
        const __m256i hi = _mm256_set1_epi32(int(0xffff0000u));
        b0 = _mm256_castsi256_ps(_mm256_and_si256(v0, hi));
        b1 = _mm256_castsi256_ps(_mm256_and_si256(v1, hi));
    } else {
        b0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
        b1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
    }
}

// R x rows against one panel; streaming: prefetch the panel ahead (the first
// pass over it, from memory). Few rows: two sets of accumulators over
// alternating k (kSets = 2), so that FMA latency does not bound the memory
// stream; with job.fixed_order every row takes one set, as 3 or more rows do.
// The loop steps over k in pairs (s = 0, 1: a bf16 pair row), k + s into set s % kSets.
template <int R, int kSets, class WT>
void micro_packed(const Job& job, const WT* panel, int64_t m0, int64_t n0, int64_t nvalid,
                  bool streaming) {
    static_assert(kSets == 1 || (kSets == 2 && R <= 2), "two sets only for 1-2 rows");
    const int64_t K = job.K;
    const float* xr[R];
    LC_UNROLL
    for (int r = 0; r < R; ++r) xr[r] = job.x + (m0 + r) * job.ldx;
    __m256 c0[kSets][R], c1[kSets][R];
    LC_UNROLL
    for (int s = 0; s < kSets; ++s)
        LC_UNROLL
        for (int r = 0; r < R; ++r) c0[s][r] = c1[s][r] = _mm256_setzero_ps();
    const char* pf = reinterpret_cast<const char*>(panel) + kPrefetchBytes;
    constexpr int64_t kRowBytes = 16 * int64_t(sizeof(WT));
    int64_t k = 0;
    for (; k + 2 <= K; k += 2) {
        if (streaming) {
            _mm_prefetch(pf + k * kRowBytes, _MM_HINT_T0);
            if (kRowBytes * 2 > 64) _mm_prefetch(pf + k * kRowBytes + 64, _MM_HINT_T0);
        }
        LC_UNROLL
        for (int s = 0; s < 2; ++s) {
            __m256 b0, b1;
            load_row16(panel, k + s, b0, b1);
            LC_UNROLL
            for (int r = 0; r < R; ++r) {
                const __m256 a = _mm256_broadcast_ss(xr[r] + k + s);
                c0[s % kSets][r] = _mm256_fmadd_ps(a, b0, c0[s % kSets][r]);
                c1[s % kSets][r] = _mm256_fmadd_ps(a, b1, c1[s % kSets][r]);
            }
        }
    }
    if (k < K) {
        __m256 b0, b1;
        load_row16(panel, k, b0, b1);
        LC_UNROLL
        for (int r = 0; r < R; ++r) {
            const __m256 a = _mm256_broadcast_ss(xr[r] + k);
            c0[0][r] = _mm256_fmadd_ps(a, b0, c0[0][r]);
            c1[0][r] = _mm256_fmadd_ps(a, b1, c1[0][r]);
        }
    }
    if (kSets == 2) {
        LC_UNROLL
        for (int r = 0; r < R; ++r) {
            c0[0][r] = _mm256_add_ps(c0[0][r], c0[kSets - 1][r]);
            c1[0][r] = _mm256_add_ps(c1[0][r], c1[kSets - 1][r]);
        }
    }
    store_tile<R>(job, c0[0], c1[0], m0, n0, nvalid);
}

template <class WT>
void micro_packed_rows(const Job& job, const WT* panel, int64_t m0, int64_t rows, int64_t n0,
                       int64_t nvalid, bool streaming) {
    const bool split = !job.fixed_order;
    switch (rows) {
        case 1:
            split ? micro_packed<1, 2>(job, panel, m0, n0, nvalid, streaming)
                  : micro_packed<1, 1>(job, panel, m0, n0, nvalid, streaming);
            break;
        case 2:
            split ? micro_packed<2, 2>(job, panel, m0, n0, nvalid, streaming)
                  : micro_packed<2, 1>(job, panel, m0, n0, nvalid, streaming);
            break;
        case 3: micro_packed<3, 1>(job, panel, m0, n0, nvalid, streaming); break;
        case 4: micro_packed<4, 1>(job, panel, m0, n0, nvalid, streaming); break;
        case 5: micro_packed<5, 1>(job, panel, m0, n0, nvalid, streaming); break;
        default: micro_packed<6, 1>(job, panel, m0, n0, nvalid, streaming); break;
    }
}

// Each thread takes a contiguous range of panels. Panels are visited in groups
// that stay in L2 while every block of kMR x rows passes over them; the first
// block streams the group in from memory (prefetching), the rest reuse it.
template <class WT>
void run_packed_typed(const Job& job) {
    const lc_weight& w = *job.packed;
    const WT* base = static_cast<const WT*>(w.data);
    const int64_t K = job.K, per_panel = weight::rows(w) * kNR;
    constexpr int64_t kGroupBytes = 192 << 10;
    const int64_t group = std::max<int64_t>(
        1, kGroupBytes / std::max<int64_t>(1, per_panel * int64_t(sizeof(WT))));
    for_tiles(job, w.panels, job.M * K * kNR, [&](int64_t p0, int64_t p1) {
        for (int64_t g0 = p0; g0 < p1; g0 += group) {
            const int64_t g1 = std::min(p1, g0 + group);
            for (int64_t m0 = 0; m0 < job.M; m0 += kMR) {
                const int64_t rows = std::min<int64_t>(kMR, job.M - m0);
                for (int64_t p = g0; p < g1; ++p) {
                    const int64_t n0 = p * kNR;
                    micro_packed_rows(job, base + p * per_panel, m0, rows, n0,
                                      std::min<int64_t>(kNR, job.N - n0), m0 == 0);
                }
            }
        }
    });
}

}  // namespace

void run_avx2(const Job& job) {
    if (job.w_dtype == LC_DTYPE_BF16)
        run_typed<uint16_t>(job);
    else
        run_typed<float>(job);
}

void run_packed_avx2(const Job& job) {
    if (job.packed->dtype == LC_DTYPE_BF16)
        run_packed_typed<uint16_t>(job);
    else
        run_packed_typed<float>(job);
}

}  // namespace lc::linear

LC_ISA_END()

#else  // not x86: never selected (best_isa() reports scalar)

namespace lc::linear {
void run_avx2(const Job&) { fail(LC_ERR_INTERNAL, "AVX2 linear kernel called on a non-x86 build"); }
void run_packed_avx2(const Job&) { fail(LC_ERR_INTERNAL, "AVX2 linear kernel called on a non-x86 build"); }
}  // namespace lc::linear

#endif
