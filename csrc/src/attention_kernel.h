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

namespace lc::attn::kernel {
namespace {

constexpr int kLd = kTile + 16;  // logits row stride: a segment's last 8-group may spill
constexpr int kMaxSegs = kTile;  // block segments per tile (block_size 1: one per position)
constexpr float kNegInf = -__builtin_inff();

// The widest x among `most`, most/2, ..., 1 such that an rb x x block of
// accumulators, the smaller operand set held in registers and one streamed
// operand fit in `regs` vector registers.
static constexpr int fit_pow2(int rb, int regs, int most) {
    for (int x = most; x > 1; x /= 2)
        if (rb * x + (rb < x ? rb : x) + 1 <= regs) return x;
    return 1;
}
// As fit_pow2, any width up to `most`.
static constexpr int fit_any(int rb, int regs, int most) {
    for (int x = most; x > 1; --x)
        if (rb * x + (rb < x ? rb : x) + 1 <= regs) return x;
    return 1;
}

// res[r][jj + b] = lane-wise partial dot products of q row r with k row jj + b.
// The smaller of the two operand sets stays in registers per chunk.
template <class Ops, int D, int RB, int JB, class KT>
inline void qk_block(const float* q, const KT* k, typename Ops::V (*res)[8], int jj) {
    using V = typename Ops::V;
    constexpr int W = Ops::W, NC = D / W;
    V a[RB][JB];
    for (int r = 0; r < RB; ++r)
        for (int b = 0; b < JB; ++b) a[r][b] = Ops::zero();
    for (int c = 0; c < NC; ++c) {
        if constexpr (RB <= JB) {
            V qq[RB];
            for (int r = 0; r < RB; ++r) qq[r] = Ops::load(q + r * D + c * W);
            for (int b = 0; b < JB; ++b) {
                const V kk = Ops::load(k + (jj + b) * D + c * W);
                for (int r = 0; r < RB; ++r) a[r][b] = Ops::fma(qq[r], kk, a[r][b]);
            }
        } else {
            V kk[JB];
            for (int b = 0; b < JB; ++b) kk[b] = Ops::load(k + (jj + b) * D + c * W);
            for (int r = 0; r < RB; ++r) {
                const V qq = Ops::load(q + r * D + c * W);
                for (int b = 0; b < JB; ++b) a[r][b] = Ops::fma(qq, kk[b], a[r][b]);
            }
        }
    }
    for (int r = 0; r < RB; ++r)
        for (int b = 0; b < JB; ++b) res[r][jj + b] = a[r][b];
}

// s[r * kLd + j] = q_r . k_j for RB rows and n positions (k rows contiguous).
// Writes up to 7 entries past n in each row (zeros); kLd leaves room.
template <class Ops, int D, int RB, class KT>
inline void qk_rows(const float* q, const KT* k, int n, float* s) {
    using V = typename Ops::V;
    constexpr int JB = fit_pow2(RB, Ops::kRegs, 8);
    V res[RB][8];
    for (int j0 = 0; j0 < n; j0 += 8) {
        const int jn = n - j0 < 8 ? n - j0 : 8;
        const KT* kg = k + j0 * D;
        int jj = 0;
        for (; jj + JB <= jn; jj += JB) qk_block<Ops, D, RB, JB>(q, kg, res, jj);
        for (; jj < jn; ++jj) qk_block<Ops, D, RB, 1>(q, kg, res, jj);
        for (; jj < 8; ++jj)
            for (int r = 0; r < RB; ++r) res[r][jj] = Ops::zero();
        for (int r = 0; r < RB; ++r) Ops::hsum8(res[r], s + r * kLd + j0);
    }
}

// Calls F<RB>(r0) over all rows in register blocks of Ops::kRowBlock rows.
template <class Ops, class F>
inline void row_blocks(int rows, F&& f) {
    constexpr int RB = Ops::kRowBlock;
    static_assert(RB >= 1 && RB <= 4, "row_blocks handles remainders up to 3");
    int r0 = 0;
    for (; r0 + RB <= rows; r0 += RB) f(std::integral_constant<int, RB>(), r0);
    switch (rows - r0) {
        case 1: f(std::integral_constant<int, 1>(), r0); break;
        case 2: if constexpr (RB > 2) f(std::integral_constant<int, 2>(), r0); break;
        case 3: if constexpr (RB > 3) f(std::integral_constant<int, 3>(), r0); break;
        default: break;
    }
}

template <class Ops, int D, class KT>
inline void qk_all(const float* q, int rows, const KT* k, int n, float* s) {
    row_blocks<Ops>(rows, [&](auto rb, int r0) {
        qk_rows<Ops, D, decltype(rb)::value>(q + r0 * D, k, n, s + r0 * kLd);
    });
}

// ---- q K^T against a transposed tile (many rows per KV head: prefill) ----
// With kt[d * kTile + j] = k_j[d], the scores of RB rows and JV*W positions are
// a small matrix product: per dimension, JV loads of kt, RB broadcasts of q and
// RB*JV FMAs, written straight into s with no horizontal sums (the row-major
// form needs a transposing reduction per 8 scores, which made q K^T cost 2-3x
// p V per FMA).

// kt[d * kTile + j] (d < D, j < npad) = the tile's K rows, widened; rows past
// n are zero. rowp[j] points at position j's K row.
template <class Ops, int D, class KT>
inline void transpose_tile(const KT* const* rowp, int n, int npad, float* kt) {
    using V = typename Ops::V;
    constexpr int W = Ops::W;
    for (int j0 = 0; j0 < npad; j0 += W) {
        for (int d0 = 0; d0 < D; d0 += W) {
            V blk[W];
            for (int i = 0; i < W; ++i)
                blk[i] = j0 + i < n ? Ops::load(rowp[j0 + i] + d0) : Ops::zero();
            Ops::transpose(blk);
            for (int i = 0; i < W; ++i) Ops::store(kt + (d0 + i) * kTile + j0, blk[i]);
        }
    }
}

template <class Ops, int D, int RB, int JV>
inline void qkt_block(const float* q, const float* kt, float* s, int j0) {
    using V = typename Ops::V;
    constexpr int W = Ops::W;
    V a[RB][JV];
    for (int r = 0; r < RB; ++r)
        for (int v = 0; v < JV; ++v) a[r][v] = Ops::zero();
    for (int d = 0; d < D; ++d) {
        V kk[JV];
        for (int v = 0; v < JV; ++v) kk[v] = Ops::load(kt + d * kTile + j0 + v * W);
        for (int r = 0; r < RB; ++r) {
            const V qq = Ops::set1(q[r * D + d]);
            for (int v = 0; v < JV; ++v) a[r][v] = Ops::fma(qq, kk[v], a[r][v]);
        }
    }
    for (int r = 0; r < RB; ++r)
        for (int v = 0; v < JV; ++v) Ops::store(s + r * kLd + j0 + v * W, a[r][v]);
}

template <class Ops, int D, int RB>
inline void qkt_rows(const float* q, const float* kt, int npad, float* s) {
    constexpr int W = Ops::W;
    int j0 = 0;
    for (; j0 + 2 * W <= npad; j0 += 2 * W) qkt_block<Ops, D, RB, 2>(q, kt, s, j0);
    if (j0 < npad) qkt_block<Ops, D, RB, 1>(q, kt, s, j0);
}

// Rows per register block: RB x 2 accumulators, 2 kt vectors and a broadcast
// (at most 8: with 32 registers, 16 accumulators already hide the FMA latency).
template <class Ops>
constexpr int kTransposedRows = (Ops::kRegs - 3) / 2 < 8 ? (Ops::kRegs - 3) / 2 : 8;

template <class Ops, int D>
inline void qkt_all(const float* q, int rows, const float* kt, int npad, float* s) {
    constexpr int RB = kTransposedRows<Ops>;
    static_assert(RB >= 1 && RB <= 8, "remainder dispatch below handles up to 7");
    int r0 = 0;
    for (; r0 + RB <= rows; r0 += RB) qkt_rows<Ops, D, RB>(q + r0 * D, kt, npad, s + r0 * kLd);
    const float* qr = q + r0 * D;
    float* sr = s + r0 * kLd;
    switch (rows - r0) {
        case 1: qkt_rows<Ops, D, 1>(qr, kt, npad, sr); break;
        case 2: if constexpr (RB > 2) qkt_rows<Ops, D, 2>(qr, kt, npad, sr); break;
        case 3: if constexpr (RB > 3) qkt_rows<Ops, D, 3>(qr, kt, npad, sr); break;
        case 4: if constexpr (RB > 4) qkt_rows<Ops, D, 4>(qr, kt, npad, sr); break;
        case 5: if constexpr (RB > 5) qkt_rows<Ops, D, 5>(qr, kt, npad, sr); break;
        case 6: if constexpr (RB > 6) qkt_rows<Ops, D, 6>(qr, kt, npad, sr); break;
        case 7: if constexpr (RB > 7) qkt_rows<Ops, D, 7>(qr, kt, npad, sr); break;
        default: break;
    }
}

// acc[r][c0*W .. (c0+CB)*W) += sum_j p[r][j] v_j over n positions.
template <class Ops, int D, int RB, int CB, class KT>
inline void pv_block(const float* p, const KT* v, int n, float* acc, int c0) {
    using V = typename Ops::V;
    constexpr int W = Ops::W;
    V a[RB][CB];
    for (int r = 0; r < RB; ++r)
        for (int c = 0; c < CB; ++c) a[r][c] = Ops::load(acc + r * D + (c0 + c) * W);
    for (int j = 0; j < n; ++j) {
        if constexpr (RB <= CB) {
            V pr[RB];
            for (int r = 0; r < RB; ++r) pr[r] = Ops::set1(p[r * kLd + j]);
            for (int c = 0; c < CB; ++c) {
                const V vv = Ops::load(v + j * D + (c0 + c) * W);
                for (int r = 0; r < RB; ++r) a[r][c] = Ops::fma(pr[r], vv, a[r][c]);
            }
        } else {
            V vv[CB];
            for (int c = 0; c < CB; ++c) vv[c] = Ops::load(v + j * D + (c0 + c) * W);
            for (int r = 0; r < RB; ++r) {
                const V pr = Ops::set1(p[r * kLd + j]);
                for (int c = 0; c < CB; ++c) a[r][c] = Ops::fma(pr, vv[c], a[r][c]);
            }
        }
    }
    for (int r = 0; r < RB; ++r)
        for (int c = 0; c < CB; ++c) Ops::store(acc + r * D + (c0 + c) * W, a[r][c]);
}

// Every column chunk from C0 on, in passes as wide as the registers allow.
template <class Ops, int D, int RB, int C0, class KT>
inline void pv_cols(const float* p, const KT* v, int n, float* acc) {
    constexpr int NC = D / Ops::W;
    if constexpr (C0 < NC) {
        constexpr int CB = fit_any(RB, Ops::kRegs, NC - C0);
        pv_block<Ops, D, RB, CB>(p, v, n, acc, C0);
        pv_cols<Ops, D, RB, C0 + CB>(p, v, n, acc);
    }
}

template <class Ops, int D, class KT>
inline void pv_all(const float* p, int rows, const KT* v, int n, float* acc) {
    row_blocks<Ops>(rows, [&](auto rb, int r0) {
        pv_cols<Ops, D, decltype(rb)::value, 0>(p + r0 * kLd, v, n, acc + r0 * D);
    });
}

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
    // Enough rows to amortize a transpose of each K tile (fp32 or bf16 cache).
    // Decode items (a few rows) keep the row-major form: a transpose would cost
    // about as much as their FMAs.
    const bool transposed = Ops::kTransposedQk && hrows >= 2 * kTransposedRows<Ops>;

    alignas(64) float q[kMaxRows * D];
    alignas(64) float acc[kMaxRows * D];
    alignas(64) float s[kMaxRows * kLd];
    alignas(64) float kv[kWiden ? kTile * D : 1];
    alignas(64) float kt[Ops::kTransposedQk ? kTile * D : 1];
    const KT* rowp[kTile];
    float m[kMaxRows], l[kMaxRows];
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
        m[r] = kNegInf;
        l[r] = 0.0f;
    }

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

    if (it.partial >= 0) {
        float* dst = job.partials + it.partial;
        for (int r = 0; r < rows; ++r, dst += D + 2) {
            dst[0] = m[r];
            dst[1] = l[r];
            for (int d = 0; d < D; ++d) dst[2 + d] = acc[r * D + d];
        }
        return;
    }
    for (int r = 0; r < rows; ++r) {
        const int64_t base = int64_t(q0 + it.tok_begin + it.row_token(r)) * job.out_stride_t +
                             it.row_head(r, group) * job.out_stride_h;
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        if (job.out_dtype == LC_DTYPE_BF16) {
            uint16_t* o = static_cast<uint16_t*>(job.out) + base;
            for (int d = 0; d < D; ++d) o[d] = f32_to_bf16(acc[r * D + d] * inv);
        } else {
            float* o = static_cast<float*>(job.out) + base;
            for (int d = 0; d < D; ++d) o[d] = acc[r * D + d] * inv;
        }
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

}  // namespace
}  // namespace lc::attn::kernel
