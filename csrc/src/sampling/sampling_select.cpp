// Threshold-based partial selection (see sampling_select.h).
#include "sampling/sampling_select.h"

#include <algorithm>

#include "sampling/sampling_kernels.h"

namespace lc::sampling {

namespace {

std::vector<float>& scratch_maxima() {
    thread_local std::vector<float> maxima;
    return maxima;
}

// Keeps the entries >= the k-th largest value; returns that value.
float shrink(std::vector<Candidate>& c, int64_t k) {
    auto kth = c.begin() + (k - 1);
    std::nth_element(c.begin(), kth, c.end(),
                     [](const Candidate& a, const Candidate& b) { return a.value > b.value; });
    const float t = kth->value;
    c.erase(std::remove_if(c.begin(), c.end(), [t](const Candidate& e) { return e.value < t; }),
            c.end());
    return t;
}

}  // namespace

void select_top_k(const float* x, const float* block_max, int64_t n, int64_t k, float lo,
                  std::vector<Candidate>& out) {
    out.clear();
    float thr = lo;
    // The k-th largest block maximum is a lower bound of the k-th largest
    // value (those k maxima are k distinct tokens): start there, so that only
    // about k blocks are ever scanned.
    const int64_t num_blocks = (n + kBlockSize - 1) / kBlockSize;
    if (num_blocks >= k) {
        std::vector<float>& maxima = scratch_maxima();
        maxima.assign(block_max, block_max + num_blocks);
        std::nth_element(maxima.begin(), maxima.begin() + (k - 1), maxima.end(),
                         [](float a, float b) { return a > b; });
        thr = std::max(thr, maxima[size_t(k - 1)]);
    }
    size_t cap = size_t(std::max<int64_t>(4 * k, 1024));
    for (int64_t i = 0; i < n; i += kBlockSize) {
        if (!(block_max[i / kBlockSize] >= thr)) continue;
        const int cnt = int(std::min<int64_t>(kBlockSize, n - i));
        const float* b = x + i;
        for (int j = 0; j < cnt; ++j)
            if (b[j] >= thr) out.push_back({b[j], int32_t(i + j)});
        if (out.size() >= cap) {
            thr = std::max(thr, shrink(out, k));
            // Ties at the threshold cannot be dropped; grow instead of thrashing.
            if (out.size() * 2 >= cap) cap *= 2;
        }
    }
    if (int64_t(out.size()) > k) shrink(out, k);
}

void select_best(const float* x, const float* block_max, int64_t n, int64_t k, float lo,
                 std::vector<Candidate>& out) {
    select_top_k(x, block_max, n, k, lo, out);
    std::sort(out.begin(), out.end(), better);
    if (int64_t(out.size()) > k) out.resize(size_t(k));
}

int64_t argmax_first(const float* x, const float* block_max, int64_t n, float m) {
    for (int64_t b = 0; b * kBlockSize < n; ++b) {
        if (block_max[b] != m) continue;
        const int64_t end = std::min(n, (b + 1) * kBlockSize);
        for (int64_t i = b * kBlockSize; i < end; ++i)
            if (x[i] == m) return i;
    }
    return -1;
}

}  // namespace lc::sampling
