// Threshold-based partial selection (see sampling_select.h).
#include "sampling_select.h"

#include <algorithm>

namespace lc::sampling {

namespace {

constexpr int kBlock = 64;

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

void select_top_k(const float* x, int64_t n, int64_t k, float lo, std::vector<Candidate>& out) {
    out.clear();
    float thr = lo;
    size_t cap = size_t(std::max<int64_t>(4 * k, 1024));
    for (int64_t i = 0; i < n; i += kBlock) {
        const int cnt = int(std::min<int64_t>(kBlock, n - i));
        const float* b = x + i;
        float bmax = b[0];
        for (int j = 1; j < cnt; ++j) bmax = b[j] > bmax ? b[j] : bmax;
        if (!(bmax >= thr)) continue;
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

void select_best(const float* x, int64_t n, int64_t k, float lo, std::vector<Candidate>& out) {
    select_top_k(x, n, k, lo, out);
    std::sort(out.begin(), out.end(), better);
    if (int64_t(out.size()) > k) out.resize(size_t(k));
}

}  // namespace lc::sampling
