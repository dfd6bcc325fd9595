// The portable linear kernel: plain loops over rows of W (the compiler may
// vectorize them for the baseline ISA). The reference the vector kernels are
// tested against, and the fallback on CPUs without AVX2.
#include <vector>

#include "linear/linear.h"

namespace lc::linear {

namespace {

template <class WT>
float widen(WT v);
template <>
inline float widen<float>(float v) { return v; }
template <>
inline float widen<uint16_t>(uint16_t v) { return bf16_to_f32(v); }

template <class WT>
void run_typed(const Job& job) {
    const WT* w = static_cast<const WT*>(job.w);
    const int64_t M = job.M, K = job.K;
    for_tiles(job, job.N, M * K, [&](int64_t n0, int64_t n1) {
        std::vector<float> acc(size_t(n1 - n0));
        for (int64_t m = 0; m < M; ++m) {
            const float* xr = job.x + m * job.ldx;
            for (int64_t n = n0; n < n1; ++n) {
                const WT* wr = w + n * K;
                float s = 0.0f;
                for (int64_t k = 0; k < K; ++k) s += xr[k] * widen<WT>(wr[k]);
                acc[size_t(n - n0)] = s;
            }
            store_row(job, m, n0, acc.data(), n1 - n0);
        }
    });
}

}  // namespace

void run_scalar(const Job& job) {
    if (job.w_dtype == LC_DTYPE_BF16)
        run_typed<uint16_t>(job);
    else
        run_typed<float>(job);
}

}  // namespace lc::linear

namespace lc::linear {

void run_packed_scalar(const Job& job) {
    const lc_weight& w = *job.packed;
    const int64_t M = job.M, K = job.K;
    for_tiles(job, w.panels, M * K * weight::kPanel, [&](int64_t p0, int64_t p1) {
        float acc[weight::kPanel];
        for (int64_t p = p0; p < p1; ++p) {
            const int64_t n0 = p * weight::kPanel;
            const int64_t nvalid = std::min<int64_t>(weight::kPanel, job.N - n0);
            for (int64_t m = 0; m < M; ++m) {
                const float* xr = job.x + m * job.ldx;
                for (int c = 0; c < weight::kPanel; ++c) acc[c] = 0.0f;
                for (int64_t k = 0; k < K; ++k)
                    for (int c = 0; c < weight::kPanel; ++c) acc[c] += xr[k] * weight::at(w, n0 + c, k);
                store_row(job, m, n0, acc, nvalid);
            }
        }
    });
}

}  // namespace lc::linear
