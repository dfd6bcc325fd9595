// The paged-attention work-item kernel, written once over a vector-ops type
// `Ops` and compiled once per instruction set (attention_isa_*.cpp include it
// inside their target region). Every template here is instantiated only with
// an Ops type of internal linkage, so the per-target copies never merge.
//
// Ops provides: V (a vector of W floats), zero/set1/load(float*)/load(bf16
// bits)/store/fma/mul/max, hmax, hsum8 (8 vectors -> 8 lane sums), exp (exact
// 0 below -87.3 and for -inf), kQkAcc / kPvAcc (accumulator register budgets).
//
// Per item, an online softmax over tiles of kTile context positions:
//   s = q K^T (per block segment) -> softcap -> mask -> m' = max(m, max s)
//   p = exp(s - m'), l = l e^(m - m') + sum p, acc = acc e^(m - m') + p V
// Do not include anything from here: the including file has already
// included every header, before its target pragma.
#pragma once

namespace lc::attn::kernel {

constexpr int kLd = kTile + 16;  // logits row stride: a segment's last 8-group may spill
constexpr float kNegInf = -__builtin_inff();

// Columns (QK: K rows; PV: vector columns) per pass so that rb x columns
// accumulators fit the register budget `acc`: 1, 2 or 4.
static constexpr int qk_jb(int rb, int acc) { return acc / rb >= 4 ? 4 : acc / rb >= 2 ? 2 : 1; }

// res[r][jj + b] = lane-wise partial dot products of q row r with k row jj + b.
template <class Ops, int D, int RB, int JB, class KT>
inline void qk_block(const float* q, const KT* k, typename Ops::V (*res)[8], int jj) {
    using V = typename Ops::V;
    constexpr int W = Ops::W, NC = D / W;
    V a[RB][JB];
    for (int r = 0; r < RB; ++r)
        for (int b = 0; b < JB; ++b) a[r][b] = Ops::zero();
    for (int c = 0; c < NC; ++c) {
        V kk[JB];
        for (int b = 0; b < JB; ++b) kk[b] = Ops::load(k + (jj + b) * D + c * W);
        for (int r = 0; r < RB; ++r) {
            const V qq = Ops::load(q + r * D + c * W);
            for (int b = 0; b < JB; ++b) a[r][b] = Ops::fma(qq, kk[b], a[r][b]);
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
    constexpr int JB = qk_jb(RB, Ops::kQkAcc);
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

template <class Ops, int D, class KT>
inline void qk_all(const float* q, int rows, const KT* k, int n, float* s) {
    constexpr int RB = 4;
    int r0 = 0;
    for (; r0 + RB <= rows; r0 += RB) qk_rows<Ops, D, RB>(q + r0 * D, k, n, s + r0 * kLd);
    switch (rows - r0) {
        case 1:
            qk_rows<Ops, D, 1>(q + r0 * D, k, n, s + r0 * kLd);
            break;
        case 2:
            qk_rows<Ops, D, 2>(q + r0 * D, k, n, s + r0 * kLd);
            break;
        case 3:
            qk_rows<Ops, D, 3>(q + r0 * D, k, n, s + r0 * kLd);
            break;
        default:
            break;
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
        V vv[CB];
        for (int c = 0; c < CB; ++c) vv[c] = Ops::load(v + j * D + (c0 + c) * W);
        for (int r = 0; r < RB; ++r) {
            const V pr = Ops::set1(p[r * kLd + j]);
            for (int c = 0; c < CB; ++c) a[r][c] = Ops::fma(pr, vv[c], a[r][c]);
        }
    }
    for (int r = 0; r < RB; ++r)
        for (int c = 0; c < CB; ++c) Ops::store(acc + r * D + (c0 + c) * W, a[r][c]);
}

template <class Ops, int D, int RB, class KT>
inline void pv_rows(const float* p, const KT* v, int n, float* acc) {
    constexpr int NC = D / Ops::W, CB = qk_jb(RB, Ops::kPvAcc), NFULL = NC / CB * CB;
    for (int c0 = 0; c0 < NFULL; c0 += CB) pv_block<Ops, D, RB, CB>(p, v, n, acc, c0);
    if constexpr (NFULL < NC)
        for (int c0 = NFULL; c0 < NC; ++c0) pv_block<Ops, D, RB, 1>(p, v, n, acc, c0);
}

// All rows, in groups of 4 so each V row is widened once per group.
template <class Ops, int D, class KT>
inline void pv_all(const float* p, int rows, const KT* v, int n, float* acc) {
    int r0 = 0;
    for (; r0 + 4 <= rows; r0 += 4) pv_rows<Ops, D, 4>(p + r0 * kLd, v, n, acc + r0 * D);
    switch (rows - r0) {
        case 1: pv_rows<Ops, D, 1>(p + r0 * kLd, v, n, acc + r0 * D); break;
        case 2: pv_rows<Ops, D, 2>(p + r0 * kLd, v, n, acc + r0 * D); break;
        case 3: pv_rows<Ops, D, 3>(p + r0 * kLd, v, n, acc + r0 * D); break;
        default: break;
    }
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

static inline float load_elem(const void* base, int32_t dtype, int64_t i) {
    return dtype == LC_DTYPE_BF16 ? bf16_to_f32(static_cast<const uint16_t*>(base)[i])
                                  : static_cast<const float*>(base)[i];
}

template <class Ops, int D, class KT>
void run_item(const Job& job, const WorkItem& it) {
    constexpr int W = Ops::W;
    const lc_attn_plan& plan = *job.plan;
    const int group = job.num_heads / job.num_kv_heads;
    const int hc = it.head_count;
    const int rows = it.tok_count * hc;
    const int32_t q0 = plan.query_start[it.seq];
    const int32_t q_len = plan.query_start[it.seq + 1] - q0;
    const int32_t first_pos = plan.seq_lens[it.seq] - q_len + it.tok_begin;
    const int32_t* bt = plan.block_tables.data() + int64_t(it.seq) * plan.max_blocks_per_seq;
    const int32_t bs = job.block_size;
    const int64_t head_stride = int64_t(bs) * D;
    const int64_t block_stride = head_stride * job.num_kv_heads;
    const KT* kbase = static_cast<const KT*>(job.k_cache) + it.kv_head * head_stride;
    const KT* vbase = static_cast<const KT*>(job.v_cache) + it.kv_head * head_stride;

    alignas(64) float q[kMaxRows * D];
    alignas(64) float acc[kMaxRows * D];
    alignas(64) float s[kMaxRows * kLd];
    float m[kMaxRows], l[kMaxRows];
    int32_t lo[kMaxRows], hi[kMaxRows];  // visible positions of row r: [lo, hi]

    for (int r = 0; r < rows; ++r) {
        const int t = r / hc;
        const int h = it.kv_head * group + it.head_begin + r % hc;
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

    for (int32_t t0 = it.ctx_begin; t0 < it.ctx_end; t0 += kTile) {
        const int n = it.ctx_end - t0 < kTile ? it.ctx_end - t0 : kTile;
        const int npad = (n + W - 1) / W * W;
        for (int32_t pos = t0; pos < t0 + n;) {
            const int32_t off = pos % bs;
            const int len = bs - off < t0 + n - pos ? bs - off : t0 + n - pos;
            const KT* kp = kbase + bt[pos / bs] * block_stride + int64_t(off) * D;
            qk_all<Ops, D>(q, rows, kp, len, s + (pos - t0));
            pos += len;
        }
        for (int r = 0; r < rows; ++r) {
            float* sr = s + r * kLd;
            if (job.softcap > 0.0f) softcap_row<Ops>(sr, npad, job.softcap);
            for (int j = n; j < npad; ++j) sr[j] = kNegInf;
            for (int j = 0; j < n && t0 + j < lo[r]; ++j) sr[j] = kNegInf;
            for (int j = hi[r] + 1 - t0 < 0 ? 0 : hi[r] + 1 - t0; j < n; ++j) sr[j] = kNegInf;
            const float mt = row_max<Ops>(sr, npad);
            const float mn = mt > m[r] ? mt : m[r];
            if (mn == kNegInf) {  // nothing visible yet: contributes nothing
                for (int j = 0; j < n; ++j) sr[j] = 0.0f;
                continue;
            }
            const float alpha = m[r] == kNegInf ? 0.0f : __builtin_expf(m[r] - mn);
            l[r] = l[r] * alpha + exp_sub_sum<Ops>(sr, npad, mn);
            m[r] = mn;
            if (alpha != 1.0f) scale_row<Ops, D>(acc + r * D, alpha);
        }
        for (int32_t pos = t0; pos < t0 + n;) {
            const int32_t off = pos % bs;
            const int len = bs - off < t0 + n - pos ? bs - off : t0 + n - pos;
            const KT* vp = vbase + bt[pos / bs] * block_stride + int64_t(off) * D;
            pv_all<Ops, D>(s + (pos - t0), rows, vp, len, acc);
            pos += len;
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
        const int t = r / hc;
        const int h = it.kv_head * group + it.head_begin + r % hc;
        const int64_t base =
            int64_t(q0 + it.tok_begin + t) * job.out_stride_t + h * job.out_stride_h;
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
void run_item_kt(const Job& job, const WorkItem& it) {
    switch (job.head_size) {
        case 64:
            run_item<Ops, 64, KT>(job, it);
            break;
        case 80:
            run_item<Ops, 80, KT>(job, it);
            break;
        case 96:
            run_item<Ops, 96, KT>(job, it);
            break;
        case 128:
            run_item<Ops, 128, KT>(job, it);
            break;
        default:
            break;  // rejected by the boundary check
    }
}

template <class Ops>
void run_item_any(const Job& job, const WorkItem& it) {
    if (job.cache_dtype == LC_DTYPE_BF16)
        run_item_kt<Ops, uint16_t>(job, it);
    else
        run_item_kt<Ops, float>(job, it);
}

}  // namespace lc::attn::kernel
