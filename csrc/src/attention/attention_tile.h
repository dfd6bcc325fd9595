// The parts a paged-attention work item is made of (attention_kernel.h includes
// this; see there): row operations on the logits (max, exp-and-sum, softcap,
// scale), the tile's block segments and the item's cached block table, the
// K/V prefetcher, and the fold of one chunk's softmax state into a row's
// total. Written over the vector-ops type `Ops`; compiled once per instruction
// set, with internal linkage (the unnamed namespace), like the kernel.
#pragma once

#include "attention/attention_dots.h"

namespace lc::attn::kernel {
namespace {

constexpr int kMaxSegs = kTile;  // block segments per tile (block_size 1: one per position)
constexpr float kNegInf = -__builtin_inff();

template <class Ops>
inline float row_max(const float* x, int npad) {
    auto m = Ops::load(x);
    for (int j = Ops::W; j < npad; j += Ops::W) m = Ops::max(m, Ops::load(x + j));
    return Ops::hmax(m);
}

// x = exp(x - m); returns the sum.
template <class Ops>
inline float exp_sub_sum(float* x, int npad, float m) {
    using V = typename Ops::V;
    const V vm = Ops::set1(m);
    V sum = Ops::zero();
    for (int j = 0; j < npad; j += Ops::W) {
        const V e = Ops::exp(Ops::sub(Ops::load(x + j), vm));
        Ops::store(x + j, e);
        sum = Ops::add(sum, e);
    }
    return Ops::hsum(sum);
}

// x = cap * tanh(x / cap), with tanh(y) = 1 - 2 / (exp(2y) + 1).
template <class Ops>
inline void softcap_row(float* x, int npad, float cap) {
    using V = typename Ops::V;
    const V two_over_cap = Ops::set1(2.0f / cap), one = Ops::set1(1.0f), two = Ops::set1(2.0f);
    const V vcap = Ops::set1(cap);
    for (int j = 0; j < npad; j += Ops::W) {
        const V e = Ops::exp(Ops::mul(Ops::load(x + j), two_over_cap));
        const V t = Ops::sub(one, Ops::div(two, Ops::add(e, one)));
        Ops::store(x + j, Ops::mul(vcap, t));
    }
}

template <class Ops, int D>
inline void scale_row(float* x, float a) {
    const auto va = Ops::set1(a);
    for (int j = 0; j < D; j += Ops::W) Ops::store(x + j, Ops::mul(Ops::load(x + j), va));
}

// dst[0, n) = src[0, n) widened to float (n a multiple of W).
template <class Ops, class KT>
inline void widen(const KT* src, int n, float* dst) {
    for (int i = 0; i < n; i += Ops::W) Ops::store(dst + i, Ops::load(src + i));
}

template <class Ops, int D, class KT>
inline void prefetch_rows(const KT* p, int rows) {
    const char* b = reinterpret_cast<const char*>(p);
    const int bytes = rows * D * int(sizeof(KT));
    for (int o = 0; o < bytes; o += 64) Ops::prefetch(b + o);
}

static inline float load_elem(const void* base, int32_t dtype, int64_t i) {
    return dtype == LC_DTYPE_BF16 ? bf16_to_f32(static_cast<const uint16_t*>(base)[i])
                                  : static_cast<const float*>(base)[i];
}

// One block's rows of a tile: positions [t0 + off, t0 + off + len).
template <class KT>
struct Seg {
    const KT* k;
    const KT* v;
    int off, len;
};

// Where one item's K/V rows live: its sequence's block table and KV head.
template <class KT>
struct ItemCache {
    const KT* kbase;
    const KT* vbase;
    const int32_t* bt;
    int32_t bs;
    int64_t block_stride;

    ItemCache(const Job& job, const WorkItem& it, int D)
        : kbase(static_cast<const KT*>(job.k_cache) + int64_t(it.kv_head) * job.block_size * D),
          vbase(static_cast<const KT*>(job.v_cache) + int64_t(it.kv_head) * job.block_size * D),
          bt(job.plan->block_tables.data() + int64_t(it.seq) * job.plan->max_blocks_per_seq),
          bs(job.block_size),
          block_stride(int64_t(job.block_size) * D * job.num_kv_heads) {}

    // The block segments of positions [t0, t1); returns their count.
    int segments(int32_t t0, int32_t t1, int D, Seg<KT>* segs) const {
        int ns = 0;
        for (int32_t pos = t0; pos < t1; ++ns) {
            const int32_t off = pos % bs;
            const int len = bs - off < t1 - pos ? bs - off : t1 - pos;
            const int64_t at = int64_t(bt[pos / bs]) * block_stride + int64_t(off) * D;
            segs[ns] = {kbase + at, vbase + at, pos - t0, len};
            pos += len;
        }
        return ns;
    }
};

// The end of the tile that starts at t0 (tiles after an item's first start
// at multiples of kTile).
inline int32_t tile_end(int32_t t0, int32_t ctx_end) {
    const int32_t e = (t0 / kTile + 1) * kTile;
    return e < ctx_end ? e : ctx_end;
}

// Walks one stream (K or V) of an item's context, then the next item's,
// issuing prefetches a fixed number of positions ahead of the compute.
template <class Ops, int D, class KT>
struct Prefetcher {
    const ItemCache<KT>* cur;
    const ItemCache<KT>* nxt;  // may be null
    int32_t cur_end, nxt_begin, nxt_end;
    int cur_heads, nxt_heads;
    int64_t head_elems;
    bool values;
    int32_t done;  // prefetched through position done - 1 (past cur_end: into nxt)

    // Prefetches positions [done, until) of the current item, running on
    // into the next item's context past cur_end.
    void advance(int32_t until) {
        while (done < until) {
            const ItemCache<KT>* c = cur;
            int heads = cur_heads;
            int32_t pos = done, lim = until < cur_end ? until : cur_end;
            if (done >= cur_end) {
                if (nxt == nullptr) return;
                c = nxt;
                heads = nxt_heads;
                pos = nxt_begin + (done - cur_end);
                lim = nxt_begin + (until - cur_end);
                if (lim > nxt_end) lim = nxt_end;
                if (pos >= lim) return;
            }
            const int32_t off = pos % c->bs;
            const int len = c->bs - off < lim - pos ? c->bs - off : lim - pos;
            const int64_t at = int64_t(c->bt[pos / c->bs]) * c->block_stride + int64_t(off) * D;
            const KT* p = (values ? c->vbase : c->kbase) + at;
            for (int k = 0; k < heads; ++k) prefetch_rows<Ops, D>(p + k * head_elems, len);
            done += len;
        }
    }
};

// Positions a stream is prefetched ahead of its use: about kPrefetchBytes
// of K (and as much of V) in flight, at least a block.
constexpr int kPrefetchBytes = 12 << 10;

// Folds one chunk's state (m, l, a) of a row into the row's running total
// (M, L, A): A = A e^(M - M') + a e^(m - M'), likewise L, M' = max(M, m). The
// kernel (an unsplit item) and merge_split (the parts of a split one) both
// fold a row's chunks with this, in position order, from an empty total.
template <class Ops, int D>
inline void fold_chunk(float& M, float& L, float* A, float m, float l, const float* a) {
    if (m == kNegInf) return;  // nothing visible in the chunk
    if (M == kNegInf) {
        M = m;
        L = l;
        for (int d = 0; d < D; d += Ops::W) Ops::store(A + d, Ops::load(a + d));
        return;
    }
    const float mx = M > m ? M : m;
    const float x = __builtin_expf(M - mx), y = __builtin_expf(m - mx);
    M = mx;
    L = __builtin_fmaf(L, x, l * y);
    const auto vx = Ops::set1(x), vy = Ops::set1(y);
    for (int d = 0; d < D; d += Ops::W)
        Ops::store(A + d, Ops::fma(Ops::load(A + d), vx, Ops::mul(Ops::load(a + d), vy)));
}

// out row r of item `it` = A / L.
template <int D>
inline void write_row(const Job& job, const WorkItem& it, int r, const float* A, float L) {
    const int32_t q0 = job.plan->query_start[it.seq];
    const int64_t base = int64_t(q0 + it.tok_begin + it.row_token(r)) * job.out_stride_t +
                         it.row_head(r, job.num_heads / job.num_kv_heads) * job.out_stride_h;
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    if (job.out_dtype == LC_DTYPE_BF16) {
        uint16_t* o = static_cast<uint16_t*>(job.out) + base;
        for (int d = 0; d < D; ++d) o[d] = f32_to_bf16(A[d] * inv);
    } else {
        float* o = static_cast<float*>(job.out) + base;
        for (int d = 0; d < D; ++d) o[d] = A[d] * inv;
    }
}

}  // namespace
}  // namespace lc::attn::kernel
