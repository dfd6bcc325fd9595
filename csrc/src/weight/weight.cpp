// lc_weight: packing, unpacking, row gathers and the huge-page allocation.
#include "weight/weight.h"

#include <vector>

#include "weight/weight_kquant.h"

#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace {

constexpr size_t kHugePage = size_t(2) << 20;

}  // namespace

void* lc::weight::alloc_memory(size_t bytes) {
    // Large matrices: 2 MiB aligned so that whole huge pages cover them.
    const size_t align = bytes >= kHugePage ? kHugePage : 64;
    const size_t rounded = (bytes + align - 1) / align * align;
    void* p = std::aligned_alloc(align, rounded);
    if (!p) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (align == kHugePage) madvise(p, rounded, MADV_HUGEPAGE);  // advice only
#endif
    return p;
}

namespace {

void check_matrix(const lc_tensor* t, const char* what) {
    lc::check_tensor(t, what, 2);
    lc::require(t->device == LC_DEVICE_CPU, std::string(what) + " must live on the CPU");
    lc::require(t->dtype == LC_DTYPE_F32 || t->dtype == LC_DTYPE_BF16,
                std::string(what) + " must be float32 or bfloat16, got " + lc::dtype_name(t->dtype));
}

}  // namespace

using lc::weight::kPanel;
using lc::weight::offset;

extern "C" lc_status lc_weight_pack(const lc_tensor* w, lc_weight** out) {
    return lc::guard([&] {
        lc::require(out != nullptr, "out is NULL");
        *out = nullptr;
        check_matrix(w, "weight");
        const int64_t N = w->shape[0], K = w->shape[1];
        auto* pw = new lc_weight;
        pw->n = N;
        pw->k = K;
        pw->dtype = w->dtype;
        pw->panels = (N + kPanel - 1) / kPanel;
        const size_t elem = lc::dtype_size(w->dtype);
        const int64_t R = lc::weight::rows(w->dtype, K);  // stored rows per panel (>= K)
        pw->bytes = size_t(pw->panels) * size_t(R) * kPanel * elem;
        try {
            pw->data = lc::weight::alloc_memory(std::max<size_t>(pw->bytes, 64));
        } catch (...) {
            delete pw;
            throw;
        }
        // Panels are independent: pack them in parallel (a large model packs in
        // a fraction of a second instead of seconds).
        lc::parallel_for(pw->panels, 4, [&](int64_t p0, int64_t p1) {
            for (int64_t p = p0; p < p1; ++p) {
                for (int c = 0; c < kPanel; ++c) {
                    const int64_t n = p * kPanel + c;
                    const char* src = static_cast<const char*>(w->data) + n * w->strides[0] * int64_t(elem);
                    if (elem == 2) {
                        uint16_t* dst = static_cast<uint16_t*>(pw->data) + offset(w->dtype, R, n, 0);
                        const uint16_t* row = reinterpret_cast<const uint16_t*>(src);
                        for (int64_t k = 0; k < R; ++k)
                            dst[(k / 2) * 2 * kPanel + (k & 1)] = n < N && k < K ? row[k] : 0;
                    } else {
                        float* dst = static_cast<float*>(pw->data) + offset(w->dtype, R, n, 0);
                        const float* row = reinterpret_cast<const float*>(src);
                        for (int64_t k = 0; k < K; ++k) dst[k * kPanel] = n < N ? row[k] : 0.0f;
                    }
                }
            }
        });
        *out = pw;
    });
}

extern "C" void lc_weight_destroy(lc_weight* w) {
    if (!w) return;
    std::free(w->data);
    delete w;
}

extern "C" lc_status lc_weight_info(const lc_weight* w, int64_t* n, int64_t* k, int32_t* dtype,
                                    int64_t* nbytes) {
    return lc::guard([&] {
        lc::require(w != nullptr, "weight is NULL");
        if (n) *n = w->n;
        if (k) *k = w->k;
        if (dtype) *dtype = w->dtype;
        if (nbytes) *nbytes = int64_t(w->bytes);
    });
}

extern "C" lc_status lc_weight_rows(const lc_weight* w, const int64_t* rows, int64_t count,
                                    const lc_tensor* out) {
    return lc::guard([&] {
        lc::require(w != nullptr, "weight is NULL");
        lc::require(count >= 0 && (count == 0 || rows != nullptr), "rows is NULL");
        lc::check_tensor(out, "out", 2);
        lc::require(out->device == LC_DEVICE_CPU, "out must live on the CPU");
        lc::require(out->dtype == LC_DTYPE_F32 || out->dtype == LC_DTYPE_BF16,
                    "out must be float32 or bfloat16");
        lc::require(out->shape[0] == count && out->shape[1] == w->k,
                    "out must be [count, K] = [" + std::to_string(count) + ", " +
                        std::to_string(w->k) + "]");
        for (int64_t i = 0; i < count; ++i)  // per token of a step: no message unless it fails
            if (rows[i] < 0 || rows[i] >= w->n)
                lc::fail(LC_ERR_INVALID_ARGUMENT, "row " + std::to_string(rows[i]) +
                                                      " is out of range [0, " +
                                                      std::to_string(w->n) + ")");
        const int64_t K = w->k;
        if (w->qtype) {  // dequantized into fp32 (exact), then rounded to out's dtype
            lc::parallel_for(count, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, K)),
                             [&](int64_t b, int64_t e) {
                std::vector<float> row(static_cast<size_t>(K));
                for (int64_t i = b; i < e; ++i) {
                    if (lc::quant::kfamily(w->qtype))
                        lc::quant::dequant_krow(*w, rows[i], row.data());
                    else
                        lc::quant::dequant_row(*w, rows[i], row.data());
                    char* o = static_cast<char*>(out->data) +
                              i * out->strides[0] * int64_t(lc::dtype_size(out->dtype));
                    for (int64_t k = 0; k < K; ++k) {
                        if (out->dtype == LC_DTYPE_F32)
                            reinterpret_cast<float*>(o)[k] = row[size_t(k)];
                        else
                            reinterpret_cast<uint16_t*>(o)[k] = lc::f32_to_bf16(row[size_t(k)]);
                    }
                }
            });
            return;
        }
        lc::parallel_for(count, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, K)),
                         [&](int64_t b, int64_t e) {
            const int64_t R = lc::weight::rows(*w);
            for (int64_t i = b; i < e; ++i) {
                const int64_t n = rows[i];
                char* o = static_cast<char*>(out->data) +
                          i * out->strides[0] * int64_t(lc::dtype_size(out->dtype));
                for (int64_t k = 0; k < K; ++k) {
                    const int64_t off = offset(w->dtype, R, n, k);
                    if (w->dtype == LC_DTYPE_BF16 && out->dtype == LC_DTYPE_BF16) {
                        reinterpret_cast<uint16_t*>(o)[k] = static_cast<const uint16_t*>(w->data)[off];
                        continue;
                    }
                    const float v = w->dtype == LC_DTYPE_BF16
                                        ? lc::bf16_to_f32(static_cast<const uint16_t*>(w->data)[off])
                                        : static_cast<const float*>(w->data)[off];
                    if (out->dtype == LC_DTYPE_F32)
                        reinterpret_cast<float*>(o)[k] = v;
                    else
                        reinterpret_cast<uint16_t*>(o)[k] = lc::f32_to_bf16(v);
                }
            }
        });
    });
}
