// The paged-attention work-item kernel, written once over a vector-ops type
// `Ops` and compiled once per instruction set (attention_isa_*.cpp include it
// inside their target region).
//
// Ops provides: V (a vector of W floats), zero/set1/load(float*)/load(bf16
// bits)/store/fma/mul/max, hmax, hsum8 (8 vectors -> 8 lane sums), exp (exact
// 0 below -87.3 and for -inf), prefetch, kRegs (vector registers),
// kRowBlock (query rows per register block) and kTransposedQk (whether it
// provides transpose(V[W]), a W x W transpose in registers, for the
// transposed-tile q K^T below).
//
// Per item, an online softmax over tiles of up to kTile context positions
// (tiles after the first start at multiples of kTile, so they cover whole
// blocks):
//   s = q K^T (per block segment) -> softcap -> mask -> m' = max(m, max s)
//   p = exp(s - m'), l = l e^(m - m') + sum p, acc = acc e^(m - m') + p V
// All of an item's rows (query tokens x query heads of one KV head) meet each
// K/V row of a tile in register blocks of kRowBlock rows, so a tile is read
// from memory once per item. While one tile is computed, the next tile's K/V
// (or the first tile of the item the worker runs next) is prefetched: a
// decode step reads its whole KV cache once, from DRAM, in 2-4 KiB block rows
// the hardware prefetcher does not follow across blocks.
// Do not include anything from here: the including file has already
// included every header, before its target pragma.
//
// Everything here has internal linkage (the unnamed namespace): each
// attention_isa_*.cpp compiles its own copy for its own target. With external
// linkage, a non-template helper or a template not parameterized by Ops
// (ItemCache<KT>, Seg<KT>, tile_end) would be emitted once per target as a
// weak symbol and the linker would keep one of them for every caller, so the
// scalar kernel could run AVX-512 code. The isa_objects ctest checks this.
#pragma once

#include "attention/attention_tile.h"

namespace lc::attn::kernel {
namespace {

template <class Ops, int D, class KT>
void run_item(const Job& job, const WorkItem& it, const WorkItem* next) {
    constexpr int W = Ops::W;
    constexpr bool kWiden = !std::is_same<KT, float>::value;
    const lc_attn_plan& plan = *job.plan;
    const int group = job.num_heads / job.num_kv_heads;
    const int rows = it.rows();
    const int hrows = it.tok_count * it.head_count;  // rows per KV head
    const int64_t head_elems = int64_t(job.block_size) * D;  // KV head stride in a block
    const int32_t q0 = plan.query_start[it.seq];
    const int32_t q_len = plan.query_start[it.seq + 1] - q0;
    const int32_t first_pos = plan.seq_lens[it.seq] - q_len + it.tok_begin;
    const ItemCache<KT> cache(job, it, D);
    // Many row blocks per KV head: widen a bf16 tile once into `kv` rather
    // than once per row block.
    const bool widen_tile = kWiden && hrows > 2 * Ops::kRowBlock;
    // Enough rows to amortize a transpose of each K tile (fp32 or bf16 cache);
    // either form gives the same scores.
    const bool transposed = Ops::kTransposedQk && hrows >= kTransposedMinRows<Ops>;

    alignas(64) float q[kMaxRows * D];
    alignas(64) float acc[kMaxRows * D];   // this chunk's p V
    alignas(64) float tacc[kMaxRows * D];  // the chunks before it, folded
    alignas(64) float s[kMaxRows * kLd];
    alignas(64) float kv[kWiden ? kTile * D : 1];
    alignas(64) float kt[Ops::kTransposedQk ? kTile * D : 1];
    const KT* rowp[kTile];
    float m[kMaxRows], l[kMaxRows], tm[kMaxRows], tl[kMaxRows];
    int32_t lo[kMaxRows], hi[kMaxRows];  // visible positions of row r: [lo, hi]
    Seg<KT> segs[kMaxSegs];

    for (int r = 0; r < rows; ++r) {
        const int t = it.row_token(r);
        const int h = it.row_head(r, group);
        const int64_t base = int64_t(q0 + it.tok_begin + t) * job.q_stride_t + h * job.q_stride_h;
        for (int d = 0; d < D; ++d)
            q[r * D + d] = load_elem(job.q, job.q_dtype, base + d) * job.scale;
        for (int d = 0; d < D; ++d) acc[r * D + d] = 0.0f;
        hi[r] = first_pos + t;
        lo[r] = job.sliding_window > 0 ? hi[r] - job.sliding_window + 1 : 0;
        if (lo[r] < 0) lo[r] = 0;
        m[r] = tm[r] = kNegInf;
        l[r] = tl[r] = 0.0f;
    }

    // Ends the current chunk: a split part stores each chunk's state in its
    // own slot (merge_split folds them), an unsplit item folds it here.
    float* slot = it.partial >= 0 ? job.partials + it.partial : nullptr;
    auto end_chunk = [&] {
        for (int r = 0; r < rows; ++r) {
            if (slot != nullptr) {
                float* dst = slot + r * partial_row_floats(D);
                dst[0] = m[r];
                dst[1] = l[r];
                for (int d = 0; d < D; ++d) dst[2 + d] = acc[r * D + d];
            } else {
                fold_chunk<Ops, D>(tm[r], tl[r], tacc + r * D, m[r], l[r], acc + r * D);
            }
            for (int d = 0; d < D; ++d) acc[r * D + d] = 0.0f;
            m[r] = kNegInf;
            l[r] = 0.0f;
        }
        if (slot != nullptr) slot += rows * partial_row_floats(D);
    };

    std::optional<ItemCache<KT>> next_cache;
    if (next != nullptr && next->ctx_end > next->ctx_begin) next_cache.emplace(job, *next, D);
    const int32_t ahead = [&] {
        const int32_t a = kPrefetchBytes / (it.kv_count * D * int32_t(sizeof(KT)));
        return a > job.block_size ? a : job.block_size;
    }();
    Prefetcher<Ops, D, KT> kpf{&cache,
                               next_cache ? &*next_cache : nullptr,
                               it.ctx_end,
                               next ? next->ctx_begin : 0,
                               next ? next->ctx_end : 0,
                               it.kv_count,
                               next ? next->kv_count : 0,
                               head_elems,
                               false,
                               it.ctx_begin};
    Prefetcher<Ops, D, KT> vpf = kpf;
    vpf.values = true;

    for (int32_t t0 = it.ctx_begin, t1; t0 < it.ctx_end; t0 = t1) {
        if (t0 % kChunk == 0 && t0 > it.ctx_begin) end_chunk();
        t1 = tile_end(t0, it.ctx_end);
        const int n = t1 - t0;
        const int npad = (n + W - 1) / W * W;
        const int ns = cache.segments(t0, t1, D, segs);

        // s = q K^T, one KV head's rows at a time.
        for (int k = 0; k < it.kv_count; ++k) {
            const float* qk = q + k * hrows * D;
            float* sk = s + k * hrows * kLd;
            const int64_t ho = k * head_elems;
            for (int g = 0; g < ns; ++g) {
                if (transposed)
                    for (int j = 0; j < segs[g].len; ++j)
                        rowp[segs[g].off + j] = segs[g].k + ho + int64_t(j) * D;
                else if (widen_tile)
                    widen<Ops>(segs[g].k + ho, segs[g].len * D, kv + segs[g].off * D);
                else
                    qk_all<Ops, D>(qk, hrows, segs[g].k + ho, segs[g].len, sk + segs[g].off);
                if (k == 0) kpf.advance(t0 + segs[g].off + segs[g].len + ahead);
            }
            if constexpr (Ops::kTransposedQk) {
                if (transposed) {
                    transpose_tile<Ops, D>(rowp, n, npad, kt);
                    qkt_all<Ops, D>(qk, hrows, kt, npad, sk);
                    continue;
                }
            }
            if constexpr (kWiden)
                if (widen_tile) qk_all<Ops, D>(qk, hrows, kv, n, sk);
        }

        for (int r = 0; r < rows; ++r) {
            float* sr = s + r * kLd;
            if (job.softcap > 0.0f) softcap_row<Ops>(sr, npad, job.softcap);
            for (int j = n; j < npad; ++j) sr[j] = kNegInf;
            if (lo[r] > t0 || hi[r] < t1 - 1) {
                for (int j = 0; j < n && t0 + j < lo[r]; ++j) sr[j] = kNegInf;
                for (int j = hi[r] + 1 - t0 < 0 ? 0 : hi[r] + 1 - t0; j < n; ++j) sr[j] = kNegInf;
            }
            const float mt = row_max<Ops>(sr, npad);
            const float mn = mt > m[r] ? mt : m[r];
            if (mn == kNegInf) {  // nothing visible yet: contributes nothing
                for (int j = 0; j < npad; ++j) sr[j] = 0.0f;
                continue;
            }
            const float alpha = m[r] == kNegInf ? 0.0f : __builtin_expf(m[r] - mn);
            l[r] = l[r] * alpha + exp_sub_sum<Ops>(sr, npad, mn);
            m[r] = mn;
            if (alpha != 1.0f) scale_row<Ops, D>(acc + r * D, alpha);
        }

        // acc += p V, one KV head's rows at a time.
        for (int k = 0; k < it.kv_count; ++k) {
            const float* pk = s + k * hrows * kLd;
            float* ak = acc + k * hrows * D;
            const int64_t ho = k * head_elems;
            for (int g = 0; g < ns; ++g) {
                if (widen_tile)
                    widen<Ops>(segs[g].v + ho, segs[g].len * D, kv + segs[g].off * D);
                else
                    pv_all<Ops, D>(pk + segs[g].off, hrows, segs[g].v + ho, segs[g].len, ak);
                if (k == 0) vpf.advance(t0 + segs[g].off + segs[g].len + ahead);
            }
            if constexpr (kWiden)
                if (widen_tile) pv_all<Ops, D>(pk, hrows, kv, n, ak);
        }
    }
    end_chunk();
    if (slot == nullptr)
        for (int r = 0; r < rows; ++r) write_row<D>(job, it, r, tacc + r * D, tl[r]);
}

// The output rows of a split item from its parts' chunk states: `first` is
// its first part, whose partials are followed by the other parts', `chunks`
// slots of first.rows() rows in all, in position order.
template <class Ops, int D>
void merge_split(const Job& job, const WorkItem& first, int32_t chunks) {
    alignas(64) float A[D];
    const int64_t row_floats = partial_row_floats(D);
    const float* slots = job.partials + first.partial;
    const int64_t slot_floats = first.rows() * row_floats;
    for (int r = 0; r < first.rows(); ++r) {
        float M = kNegInf, L = 0.0f;
        for (int32_t c = 0; c < chunks; ++c) {
            const float* p = slots + c * slot_floats + r * row_floats;
            fold_chunk<Ops, D>(M, L, A, p[0], p[1], p + 2);
        }
        write_row<D>(job, first, r, A, L);
    }
}

template <class Ops, class KT>
void run_item_kt(const Job& job, const WorkItem& it, const WorkItem* next) {
    // a size off the list was rejected by the boundary check
    HeadSizes::visit(job.head_size,
                     [&](auto d) { run_item<Ops, decltype(d)::value, KT>(job, it, next); });
}

template <class Ops>
void run_item_any(const Job& job, const WorkItem& it, const WorkItem* next) {
    if (job.cache_dtype == LC_DTYPE_BF16)
        run_item_kt<Ops, uint16_t>(job, it, next);
    else
        run_item_kt<Ops, float>(job, it, next);
}

template <class Ops>
void merge_split_any(const Job& job, const WorkItem& first, int32_t chunks) {
    HeadSizes::visit(job.head_size,
                     [&](auto d) { merge_split<Ops, decltype(d)::value>(job, first, chunks); });
}

}  // namespace
}  // namespace lc::attn::kernel
