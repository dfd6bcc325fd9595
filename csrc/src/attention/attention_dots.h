// The dot products of the paged-attention kernel (attention_kernel.h includes
// this; see there): q K^T in its two forms, row-major (few rows per KV head)
// and on a transposed tile (many), which give every score the same bits, and
// p V. Written over the vector-ops type `Ops`; compiled once per instruction
// set, with internal linkage (the unnamed namespace), like the kernel.
#pragma once

namespace lc::attn::kernel {
namespace {

constexpr int kLd = kTile + 16;  // logits row stride: a segment's last 8-group may spill

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
//
// A score is summed over the head dimension in the row-major form's order, so
// that a row gets the same bits whichever form its item takes (a prefill
// chunk's rows take this one, a decode row the row-major one): lane i of the
// row-major form accumulates q[d] k[d] for d = i, i + W, i + 2W, ... from zero,
// and Ops::hsum8 adds the lanes in a fixed tree (16 lanes: lane i + 8 onto lane
// i; then lanes 0-7 pairwise: ((0+1)+(2+3))+((4+5)+(6+7))). Here each lane's
// chain runs down the rows i, i + W, ... of kt and the chains are added in the
// same tree: W - 1 adds per W scores more than one chain over d would take
// (about a quarter more work on q K^T at head size 64 with 16 lanes, an eighth
// with 8), and the chains' sums pass through memory.

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

// a[r][v] = lane i of the row-major form: sum over d = i, i + W, ... < D of
// q_r[d] kt[d][j0 + v W ..], from zero, in that order.
template <class Ops, int D, int RB, int JV>
inline void lane_chain(const float* q, const float* kt, int j0, int i,
                       typename Ops::V (&a)[RB][JV]) {
    using V = typename Ops::V;
    constexpr int W = Ops::W;
    for (int r = 0; r < RB; ++r)
        for (int v = 0; v < JV; ++v) a[r][v] = Ops::zero();
    for (int d = i; d < D; d += W) {
        V kk[JV];
        for (int v = 0; v < JV; ++v) kk[v] = Ops::load(kt + d * kTile + j0 + v * W);
        for (int r = 0; r < RB; ++r) {
            const V qq = Ops::set1(q[r * D + d]);
            for (int v = 0; v < JV; ++v) a[r][v] = Ops::fma(qq, kk[v], a[r][v]);
        }
    }
}

// The sum of lanes [L, L + N) of hsum8's eight (f[i] for lane i), added in its tree.
template <class Ops, int L, int N>
inline typename Ops::V lane_tree(const typename Ops::V* f) {
    if constexpr (N == 1)
        return f[L];
    else
        return Ops::add(lane_tree<Ops, L, N / 2>(f), lane_tree<Ops, L + N / 2, N / 2>(f));
}

// The scores of RB rows and JV vectors of positions from j0: every lane chain
// for all RB x JV at once (independent chains, which hide the FMA latency),
// kept in `lanes` as hsum8's eight (with 16 lanes, lane i + 8's chain added
// onto lane i's), then its tree over them per score.
template <class Ops, int D, int RB, int JV>
inline void qkt_block(const float* q, const float* kt, float* s, int j0) {
    using V = typename Ops::V;
    constexpr int W = Ops::W;
    static_assert(W == 8 || W == 16, "hsum8's tree is written for 8 or 16 lanes");
    V lanes[8][RB][JV];
    for (int i = 0; i < 8; ++i) lane_chain<Ops, D, RB, JV>(q, kt, j0, i, lanes[i]);
    if constexpr (W == 16) {
        for (int i = 0; i < 8; ++i) {
            V a[RB][JV];
            lane_chain<Ops, D, RB, JV>(q, kt, j0, i + 8, a);
            for (int r = 0; r < RB; ++r)
                for (int v = 0; v < JV; ++v) lanes[i][r][v] = Ops::add(lanes[i][r][v], a[r][v]);
        }
    }
    for (int r = 0; r < RB; ++r)
        for (int v = 0; v < JV; ++v) {
            V f[8];
            for (int i = 0; i < 8; ++i) f[i] = lanes[i][r][v];
            Ops::store(s + r * kLd + j0 + v * W, lane_tree<Ops, 0, 8>(f));
        }
}

template <class Ops, int D, int RB>
inline void qkt_rows(const float* q, const float* kt, int npad, float* s) {
    constexpr int W = Ops::W;
    int j0 = 0;
    for (; j0 + 2 * W <= npad; j0 += 2 * W) qkt_block<Ops, D, RB, 2>(q, kt, s, j0);
    if (j0 < npad) qkt_block<Ops, D, RB, 1>(q, kt, s, j0);
}

// Rows per register block: RB x 2 chains, 2 kt vectors and a broadcast (at
// most 8: with 32 registers, 16 chains already hide the FMA latency).
template <class Ops>
constexpr int kTransposedRows = (Ops::kRegs - 3) / 2 < 8 ? (Ops::kRegs - 3) / 2 : 8;
// Rows per KV head from which an item takes this form: enough to amortize the
// transpose of each K tile. Decode items (a few rows) keep the row-major form:
// a transpose would cost about as much as their FMAs.
template <class Ops>
constexpr int kTransposedMinRows = 2 * kTransposedRows<Ops>;

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

}  // namespace
}  // namespace lc::attn::kernel
