// Block-wide weighted radix selection over a row, used for top-k (weights
// 1: the k-th largest value), top-p (weights exp(v - m): the cut-off of the
// sorted cumulative mass) and the token-id cut-off among tied values.
//
// Walking keys from largest to smallest, select() finds the first key K at
// which the cumulative weight of the members with key >= K reaches target,
// one 8-bit digit per pass (4 passes over the row). before = weight of the
// members with key > K. If the members' total stays below target, reached is
// false (the caller then keeps every member).
#pragma once

#include "sampling_math.cuh"

namespace lc::cuda::samp {

struct Selection {
    uint32_t key;
    double before;
    bool reached;
};

struct SelectShared {
    double bins[256];
    uint32_t prefix;
    double before;
    int reached;
};

// key_of(i, &key) -> bool: whether element i is a member, and its key.
// weight_of(i, key) -> double: its weight (> 0).
template <class KeyOf, class WeightOf>
__device__ Selection select_desc(int64_t n, KeyOf key_of, WeightOf weight_of, double target,
                                 SelectShared& sh) {
    const int tid = threadIdx.x;
    if (tid == 0) {
        sh.prefix = 0;
        sh.before = 0.0;
        sh.reached = 1;
    }
    for (int pass = 0; pass < 4; ++pass) {
        const int shift = 24 - 8 * pass;
        const uint32_t hi_mask = pass == 0 ? 0u : ~0u << (32 - 8 * pass);
        for (int b = tid; b < 256; b += kThreads) sh.bins[b] = 0.0;
        __syncthreads();
        const uint32_t prefix = sh.prefix;
        for (int64_t i = tid; i < n; i += kThreads) {
            uint32_t k;
            if (key_of(i, k) && (k & hi_mask) == prefix)
                atomicAdd(&sh.bins[(k >> shift) & 255u], weight_of(i, k));
        }
        __syncthreads();
        if (tid == 0) {
            double cum = sh.before;
            int chosen = -1, last = -1;
            double cum_last = cum;
            for (int b = 255; b >= 0; --b) {
                const double w = sh.bins[b];
                if (w == 0.0) continue;
                if (cum + w >= target) {
                    chosen = b;
                    break;
                }
                last = b;
                cum_last = cum;
                cum += w;
            }
            if (chosen < 0 && pass > 0 && last >= 0) {
                // The bin chosen by the previous pass reached target, but this
                // pass summed its mass in another order and fell just short:
                // stay inside it by taking its smallest digit.
                chosen = last;
                cum = cum_last;
            }
            if (chosen < 0) {
                sh.reached = 0;
            } else {
                sh.prefix = prefix | (uint32_t(chosen) << shift);
                sh.before = cum;
            }
        }
        __syncthreads();
        if (!sh.reached) break;
    }
    Selection s{sh.prefix, sh.before, sh.reached != 0};
    __syncthreads();  // sh may be reused by the next selection
    return s;
}

}  // namespace lc::cuda::samp
