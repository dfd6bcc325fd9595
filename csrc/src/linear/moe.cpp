// lc_moe_experts: the routed experts of a mixture-of-experts layer in one call,
//   out[t] = sum_j w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])),  e = ids[t, j],
// for SiLU-gated experts (Qwen3-MoE, Mixtral; the router's softmax, top-k and
// renormalisation stay with the caller, who passes the chosen ids and weights).
//
// Grouped, not per token: the T * k routed rows are gathered by expert (expert
// e's rows are [start[e], start[e + 1]) of one scratch matrix, in token order),
// each used expert runs its gate/up product on its rows as one M-row packed
// linear (linear.h: the Job path, so every weight format the packed linear runs,
// float or quantized, runs here), silu(gate) * up is formed in place, the down
// product writes back over the gathered rows, and each token's k results are
// summed in the order of its top-k list. A decode step thus reads every used
// expert's weights once, whatever T.
//
// Bits: a gathered row's products do not depend on which rows share its expert
// (Job::fixed_order; quantized activations are rounded per row) and the sum of a
// token's k terms has a fixed order, so out[t] depends on x[t], its ids and
// weights only: the same bits alone or in any batch, for any thread count.
//
// Threads: with few rows per expert and more used experts than threads (decode),
// each worker runs whole experts (their linears then run serially inside it);
// otherwise the experts run one after the other and each linear spreads its
// panels over the pool. The gather, the activation and the weighted sum are
// split by rows.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "elementwise/elementwise.h"
#include "linear/linear.h"

namespace lc::moe {
namespace {

struct Call {
    const float* x;
    int64_t ldx;
    const void* ids;
    int32_t ids_bytes;
    const float* w;  // topk_weights, row stride ldw
    int64_t ldw;
    const lc_weight* const* gate_up;
    const lc_weight* const* down;
    float* out;
    int64_t ldo;
    int64_t T, k, H, I, E;
};

std::string dims(int64_t a, int64_t b) {
    return "[" + std::to_string(a) + ", " + std::to_string(b) + "]";
}

// The experts' matrices: every gate_up [2I, H] and every down [H, I], one I.
void check_experts(Call& c) {
    require(c.gate_up && c.down, "gate_up and down must be arrays of num_experts weights");
    for (int64_t e = 0; e < c.E; ++e) {
        const lc_weight* gu = c.gate_up[e];
        const lc_weight* dn = c.down[e];
        require(gu && dn, "expert " + std::to_string(e) + " has no gate_up or down weight");
        if (e == 0) {
            require(gu->n % 2 == 0 && gu->n > 0,
                    "gate_up[0] has " + std::to_string(gu->n) +
                        " rows: it must be [2 * I, H] (the gate rows, then the up rows)");
            c.I = gu->n / 2;
        }
        require(gu->n == 2 * c.I && gu->k == c.H,
                "gate_up[" + std::to_string(e) + "] is " + dims(gu->n, gu->k) + ", expected " +
                    dims(2 * c.I, c.H) + " (every expert the same shape, H from x)");
        require(dn->n == c.H && dn->k == c.I,
                "down[" + std::to_string(e) + "] is " + dims(dn->n, dn->k) + ", expected " +
                    dims(c.H, c.I));
    }
}

Call validate(const lc_tensor* x, const void* ids, int32_t ids_bytes, const lc_tensor* w,
              const lc_weight* const* gate_up, const lc_weight* const* down, int32_t num_experts,
              const lc_tensor* out) {
    require(x && w && out, "x, topk_weights and out are required");
    for (const lc_tensor* t : {x, w, out})
        if (t->device == LC_DEVICE_CUDA)
            fail(LC_ERR_UNSUPPORTED, "lc_moe_experts runs on the CPU only: CUDA tensors are not "
                                     "supported");
    for (const lc_tensor* t : {x, w, out})
        require(t->device == LC_DEVICE_CPU, "lc_moe_experts: tensors must live on the CPU");
    check_tensor(x, "x", 2);
    check_tensor(w, "topk_weights", 2);
    check_tensor(out, "out", 2);
    const std::pair<const lc_tensor*, const char*> named[] = {
        {x, "x"}, {w, "topk_weights"}, {out, "out"}};
    for (const auto& [t, name] : named)
        require(t->dtype == LC_DTYPE_F32,
                std::string(name) + " must be float32, got " + dtype_name(t->dtype));
    Call c{};
    c.T = x->shape[0];
    c.H = x->shape[1];
    c.k = w->shape[1];
    c.E = num_experts;
    require(num_experts >= 1, "num_experts must be >= 1, got " + std::to_string(num_experts));
    require(c.H >= 1, "x must have at least one column");
    require(w->shape[0] == c.T && c.k >= 1,
            "topk_weights " + dims(w->shape[0], w->shape[1]) + " must be [T, k] with T = " +
                std::to_string(c.T) + " (x's rows) and k >= 1");
    require(out->shape[0] == c.T && out->shape[1] == c.H,
            "out " + dims(out->shape[0], out->shape[1]) + " must be " + dims(c.T, c.H));
    require(c.T <= 1 || x->strides[0] >= c.H, "x rows overlap (row stride < H)");
    require(c.T <= 1 || out->strides[0] >= c.H, "out rows overlap (row stride < H)");
    require(c.T <= 1 || w->strides[0] >= c.k, "topk_weights rows overlap (row stride < k)");
    require(ids_bytes == 4 || ids_bytes == 8,
            "topk_ids must be int32 or int64 (ids_bytes 4 or 8), got ids_bytes " +
                std::to_string(ids_bytes));
    require(ids || c.T == 0, "topk_ids is NULL");
    // out may be x itself (x is read in full before out is written), or apart from it.
    const bool same = out->data == x->data && out->strides[0] == x->strides[0];
    require(same || !overlaps(*out, *x), "out must be x or not overlap it");
    require(!overlaps(*out, *w), "out must not overlap topk_weights");
    if (c.T > 0) {
        lc_tensor id_bytes{};  // the ids' bytes, as a tensor for the overlap test
        id_bytes.data = const_cast<void*>(ids);
        id_bytes.dtype = LC_DTYPE_F32;
        id_bytes.ndim = 1;
        id_bytes.shape[0] = c.T * c.k * (ids_bytes / 4);
        id_bytes.strides[0] = 1;
        require(!overlaps(*out, id_bytes), "out must not overlap topk_ids");
    }
    c.x = static_cast<const float*>(x->data);
    c.ldx = x->strides[0];
    c.ids = ids;
    c.ids_bytes = ids_bytes;
    c.w = static_cast<const float*>(w->data);
    c.ldw = w->strides[0];
    c.gate_up = gate_up;
    c.down = down;
    c.out = static_cast<float*>(out->data);
    c.ldo = out->strides[0];
    check_experts(c);
    return c;
}

// Where the routed rows go: expert e's gathered rows are [start[e], start[e + 1]),
// (t, j) is row slot[t * k + j], in token order within an expert.
struct Routing {
    std::vector<int64_t> start, slot;
    std::vector<int32_t> used;  // experts with rows, ascending
    int64_t max_rows = 0;
};

template <class Id>
Routing route(const Call& c, const Id* ids) {
    const int64_t n = c.T * c.k;
    Routing r;
    r.start.assign(size_t(c.E + 1), 0);
    for (int64_t i = 0; i < n; ++i) {
        const Id e = ids[i];
        if (e < 0 || int64_t(e) >= c.E)
            fail(LC_ERR_INVALID_ARGUMENT,
                 "topk_ids[" + std::to_string(i / c.k) + ", " + std::to_string(i % c.k) +
                     "] = " + std::to_string(int64_t(e)) + " is not an expert (0 <= id < " +
                     std::to_string(c.E) + ")");
        ++r.start[size_t(e) + 1];
    }
    for (int64_t e = 0; e < c.E; ++e) {
        const int64_t rows = r.start[size_t(e) + 1];
        if (rows) r.used.push_back(int32_t(e));
        r.max_rows = std::max(r.max_rows, rows);
        r.start[size_t(e) + 1] += r.start[size_t(e)];
    }
    std::vector<int64_t> next(r.start.begin(), r.start.end() - 1);
    r.slot.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) r.slot[size_t(i)] = next[size_t(ids[i])]++;
    return r;
}

// Rows per parallel chunk: about 64k elements of work.
int64_t grain(int64_t row_elems) {
    return std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, row_elems));
}

// out = x @ W^T for M gathered rows, every row summed in one order.
void product(const float* x, int64_t ldx, const lc_weight* w, float* out, int64_t ldo, int64_t M) {
    linear::Job job{};
    job.x = x;
    job.ldx = ldx;
    job.packed = w;
    job.w = w->data;
    job.w_dtype = w->dtype;
    job.out = out;
    job.ldo = ldo;
    job.out_dtype = LC_DTYPE_F32;
    job.M = M;
    job.N = w->n;
    job.K = w->k;
    job.fixed_order = true;
    linear::dispatch(job);
}

void run(const Call& c, const Routing& r) {
    const int64_t rows = c.T * c.k, H = c.H, I = c.I, k = c.k;
    // xs [rows][H]: the gathered x, then the down products; gu [rows][2I]: gate | up,
    // then silu(gate) * up over the gate half. Up to kKeepBytes it is kept per thread
    // between calls (decode, batches); a larger one (a long prefill) lives for the call.
    constexpr size_t kKeepBytes = size_t(64) << 20;
    const size_t need = size_t(rows * (H + 2 * I));
    thread_local std::vector<float> kept;
    std::unique_ptr<float[]> once;
    float* xs;
    if (need * sizeof(float) <= kKeepBytes) {
        if (kept.size() < need) kept.resize(need);
        xs = kept.data();
    } else {
        once.reset(new float[need]);
        xs = once.get();
    }
    float* gu = xs + rows * H;

    parallel_for(c.T, grain(H * k), [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
            for (int64_t j = 0; j < k; ++j)
                std::memcpy(xs + r.slot[size_t(t * k + j)] * H, c.x + t * c.ldx,
                            size_t(H) * sizeof(float));
    });

    const auto n_used = int64_t(r.used.size());
    const bool per_worker = r.max_rows <= linear::kSmallM && n_used >= 2 * int64_t(num_threads());
    auto each_expert = [&](auto&& fn) {
        if (per_worker)
            parallel_for(n_used, 1, [&](int64_t i0, int64_t i1) {
                for (int64_t i = i0; i < i1; ++i) fn(r.used[size_t(i)]);
            });
        else
            for (const int32_t e : r.used) fn(e);
    };
    auto range = [&](int32_t e) {
        return std::pair{r.start[size_t(e)], r.start[size_t(e) + 1] - r.start[size_t(e)]};
    };

    each_expert([&](int32_t e) {
        const auto [s, m] = range(e);
        product(xs + s * H, H, c.gate_up[e], gu + s * 2 * I, 2 * I, m);
    });
    const elementwise::SiluMulRowFn silu_mul = elementwise::kernels().silu_mul_row;
    parallel_for(rows, grain(I), [&](int64_t r0, int64_t r1) {
        for (int64_t i = r0; i < r1; ++i) {
            float* g = gu + i * 2 * I;
            silu_mul(g, g + I, I, g);
        }
    });
    each_expert([&](int32_t e) {
        const auto [s, m] = range(e);
        product(gu + s * 2 * I, 2 * I, c.down[e], xs + s * H, H, m);
    });

    parallel_for(c.T, grain(H * k), [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
            float* o = c.out + t * c.ldo;
            const float* wt = c.w + t * c.ldw;
            const float* y = xs + r.slot[size_t(t * k)] * H;
            const float w0 = wt[0];
            for (int64_t h = 0; h < H; ++h) o[h] = w0 * y[h];
            for (int64_t j = 1; j < k; ++j) {
                y = xs + r.slot[size_t(t * k + j)] * H;
                const float wj = wt[j];
                for (int64_t h = 0; h < H; ++h) o[h] += wj * y[h];
            }
        }
    });
}

}  // namespace
}  // namespace lc::moe

extern "C" lc_status lc_moe_experts(const lc_tensor* x, const void* topk_ids, int32_t ids_bytes,
                                    const lc_tensor* topk_weights,
                                    const lc_weight* const* gate_up,
                                    const lc_weight* const* down, int32_t num_experts,
                                    const lc_tensor* out) {
    return lc::guard([&] {
        using namespace lc::moe;
        const Call c =
            validate(x, topk_ids, ids_bytes, topk_weights, gate_up, down, num_experts, out);
        const Routing r = ids_bytes == 4 ? route(c, static_cast<const int32_t*>(topk_ids))
                                         : route(c, static_cast<const int64_t*>(topk_ids));
        if (c.T == 0) return;
        run(c, r);
    });
}
