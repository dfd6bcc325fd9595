// Partial selection over a row of scaled logits: the k best tokens without
// sorting the vocabulary. A running threshold rises as better tokens arrive,
// so after the first few blocks almost every block is skipped by one
// vectorized max.
#pragma once

#include <cstdint>
#include <vector>

namespace lc::sampling {

struct Candidate {
    float value;
    int32_t token;
};

// Order of the sampler everywhere: higher value first, then lower token id.
inline bool better(const Candidate& a, const Candidate& b) {
    return a.value > b.value || (a.value == b.value && a.token < b.token);
}

// Fills out with every token i where x[i] >= lo and x[i] >= the k-th largest
// value among those (ties at the k-th value are all kept, as vLLM's top-k
// does). Unordered. k >= 1. block_max[b] = max of x over block b of
// kBlockSize tokens.
void select_top_k(const float* x, const float* block_max, int64_t n, int64_t k, float lo,
                  std::vector<Candidate>& out);

// The k best tokens with x[i] >= lo, sorted by better(); fewer when fewer qualify.
void select_best(const float* x, const float* block_max, int64_t n, int64_t k, float lo,
                 std::vector<Candidate>& out);

// First i with x[i] == m (m = max of x), found through the block maxima.
int64_t argmax_first(const float* x, const float* block_max, int64_t n, float m);

}  // namespace lc::sampling
