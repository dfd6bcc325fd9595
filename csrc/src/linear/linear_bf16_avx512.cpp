// The packed linear for bf16 weights with AVX512_BF16 (selected at run time on
// CPUs that have it, for every M; see linear.h).
//
// vdpbf16ps multiplies pairs of bf16 and adds both products into an fp32 lane:
// acc[c] += x[k] w[k][c] + x[k+1] w[k+1][c], 32 multiply-adds per instruction,
// twice the fp32 FMA's rate. So the activations are rounded to bf16 once per
// call (as a bf16 model's activations are), packed as (x[k], x[k+1]) pairs
// (linear_bf16_pack.h), and each pair row of a weight panel is already 16 lanes
// of (w[k][c], w[k+1][c]) (weight.h). The packed layout is the one every
// variant reads, so a weight packed once serves whichever kernel runs.
//
// Work split and cache blocking as in the AVX2 packed kernel: each thread takes
// a range of panels, visits them in L2-sized groups, and every block of kMR x
// rows passes over a group; the microkernel holds kMR x 2 panels of
// accumulators (20 of the 32 vector registers).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/isa_target.h"
#include "linear/linear.h"

#if LC_ISA_X86
#include <immintrin.h>

LC_ISA_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")

#include "linear/linear_bf16_pack.h"

namespace lc::linear {
namespace {

constexpr int kNR = 16;  // columns per panel
static_assert(kNR == weight::kPanel, "the packed kernels read weight.h's panels as kNR wide");
constexpr int kMR = 10;  // x rows per microkernel

// The k-pair kk of a panel: 16 lanes of (w[2kk][c], w[2kk+1][c]), as stored
// (weight.h; with an odd K the last pair's second row is zero, and so is its
// activation).
inline __m512i pair_row(const uint16_t* panel, int64_t kk) {
    return _mm512_loadu_si512(panel + 2 * kk * kNR);
}

// Bytes a streaming pass prefetches ahead of its use in each panel.
constexpr int64_t kPrefetchBytes = 1024;

// R rows of xb (bf16 pairs, row stride K2) against P adjacent panels; streaming:
// the first pass over them (from memory), prefetched ahead.
template <int R, int P>
void micro(const Job& job, const uint32_t* xb, int64_t K2, const uint16_t* panel, int64_t m0,
           int64_t n0, int64_t nvalid_last, bool streaming) {
    const int64_t per_panel = weight::rows(*job.packed) * kNR;
    __m512 acc[R][P];
    LC_UNROLL
    for (int r = 0; r < R; ++r)
        LC_UNROLL
        for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
    const uint32_t* xr = xb + m0 * K2;
    const char* pf = reinterpret_cast<const char*>(panel) + kPrefetchBytes;
    for (int64_t kk = 0; kk < K2; ++kk) {
        if (streaming)  // one 64-byte k-pair per panel per step
            LC_UNROLL
            for (int p = 0; p < P; ++p)
                _mm_prefetch(pf + (p * per_panel + 2 * kk * kNR) * 2, _MM_HINT_T0);
        __m512i w[P];
        LC_UNROLL
        for (int p = 0; p < P; ++p) w[p] = pair_row(panel + p * per_panel, kk);
        LC_UNROLL
        for (int r = 0; r < R; ++r) {
            const __m512i a = _mm512_set1_epi32(int(xr[r * K2 + kk]));
            LC_UNROLL
            for (int p = 0; p < P; ++p)
                acc[r][p] = _mm512_dpbf16_ps(acc[r][p], (__m512bh)a, (__m512bh)w[p]);
        }
    }
    LC_UNROLL
    for (int p = 0; p < P; ++p) {
        const int64_t c0 = n0 + p * kNR;
        const int64_t nvalid = p + 1 < P ? kNR : nvalid_last;
        if (job.out_dtype == LC_DTYPE_F32 && nvalid == kNR) {
            const __m512 bias = job.bias ? _mm512_loadu_ps(job.bias + c0) : _mm512_setzero_ps();
            LC_UNROLL
            for (int r = 0; r < R; ++r)
                _mm512_storeu_ps(static_cast<float*>(job.out) + (m0 + r) * job.ldo + c0,
                                 _mm512_add_ps(acc[r][p], bias));
            continue;
        }
        LC_UNROLL
        for (int r = 0; r < R; ++r) {
            alignas(64) float v[kNR];
            _mm512_store_ps(v, acc[r][p]);
            store_row(job, m0 + r, c0, v, nvalid);
        }
    }
}

template <int P>
void micro_rows(const Job& job, const uint32_t* xb, int64_t K2, const uint16_t* panel,
                int64_t m0, int64_t rows, int64_t n0, int64_t nvalid_last, bool streaming) {
    switch (rows) {
        case 1: micro<1, P>(job, xb, K2, panel, m0, n0, nvalid_last, streaming); break;
        case 2: micro<2, P>(job, xb, K2, panel, m0, n0, nvalid_last, streaming); break;
        case 3: micro<3, P>(job, xb, K2, panel, m0, n0, nvalid_last, streaming); break;
        case 4: micro<4, P>(job, xb, K2, panel, m0, n0, nvalid_last, streaming); break;
        case 5: micro<5, P>(job, xb, K2, panel, m0, n0, nvalid_last, streaming); break;
        case 6: micro<6, P>(job, xb, K2, panel, m0, n0, nvalid_last, streaming); break;
        case 7: micro<7, P>(job, xb, K2, panel, m0, n0, nvalid_last, streaming); break;
        case 8: micro<8, P>(job, xb, K2, panel, m0, n0, nvalid_last, streaming); break;
        case 9: micro<9, P>(job, xb, K2, panel, m0, n0, nvalid_last, streaming); break;
        default: micro<kMR, P>(job, xb, K2, panel, m0, n0, nvalid_last, streaming); break;
    }
}

}  // namespace

void run_packed_bf16_avx512(const Job& job) {
    const lc_weight& w = *job.packed;
    const uint16_t* base = static_cast<const uint16_t*>(w.data);
    const int64_t K = job.K, K2 = (K + 1) / 2, per_panel = weight::rows(w) * kNR;
    thread_local std::vector<uint32_t> xb_buf;
    xb_buf.resize(size_t(job.M * K2));
    pack_bf16_pairs(job, xb_buf.data(), K2, job.M);
    const uint32_t* xb = xb_buf.data();  // the workers read this thread's buffer
    constexpr int64_t kGroupBytes = 192 << 10;
    // Groups of an even number of panels, so that pairs never straddle two groups.
    const int64_t group = std::max<int64_t>(
        2, kGroupBytes / std::max<int64_t>(1, per_panel * 2) / 2 * 2);
    const int64_t units = (w.panels + 1) / 2;  // panel pairs
    for_tiles(job, units, job.M * K * 2 * kNR, [&](int64_t u0, int64_t u1) {
        const int64_t p0 = 2 * u0, p1 = std::min(w.panels, 2 * u1);
        for (int64_t g0 = p0; g0 < p1; g0 += group) {
            const int64_t g1 = std::min(p1, g0 + group);
            for (int64_t m0 = 0; m0 < job.M; m0 += kMR) {
                const int64_t rows = std::min<int64_t>(kMR, job.M - m0);
                for (int64_t p = g0; p < g1; p += 2) {
                    const int64_t n0 = p * kNR;
                    const uint16_t* panel = base + p * per_panel;
                    if (p + 1 < g1) {
                        const int64_t last = std::min<int64_t>(kNR, job.N - n0 - kNR);
                        micro_rows<2>(job, xb, K2, panel, m0, rows, n0, last, m0 == 0);
                    } else {
                        const int64_t last = std::min<int64_t>(kNR, job.N - n0);
                        micro_rows<1>(job, xb, K2, panel, m0, rows, n0, last, m0 == 0);
                    }
                }
            }
        }
    });
}

}  // namespace lc::linear

LC_ISA_END()

#else  // not x86-64: never selected (best_isa() reports avx2 at most)

namespace lc::linear {
void run_packed_bf16_avx512(const Job&) {
    fail(LC_ERR_INTERNAL, "AVX512_BF16 linear kernel called on a non-x86 build");
}
}  // namespace lc::linear

#endif
