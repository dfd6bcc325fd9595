// lc_rms_norm, lc_silu_mul, lc_rope: validation, threading over rows, and the
// portable kernels.
#include "elementwise/elementwise.h"

#include <cmath>
#include <string>
#include <vector>

namespace lc::elementwise {

namespace {

IsaSetting& isa_setting() {
    static IsaSetting setting("LLMCORE_ELEMENTWISE_ISA", Isa::kAvx512);
    return setting;
}

void rms_row_scalar(const float* x, float* res, const float* w, float eps, int64_t n, float* out) {
    const float* src = x;
    if (res) {
        for (int64_t i = 0; i < n; ++i) res[i] += x[i];
        src = res;
    }
    float ss = 0.0f;
    for (int64_t i = 0; i < n; ++i) ss += src[i] * src[i];
    const float inv = 1.0f / std::sqrt(ss / float(n) + eps);
    for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (src[i] * inv);
}

void silu_mul_row_scalar(const float* g, const float* u, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void rope_head_scalar(float* x1, const float* c, const float* s, int64_t half) {
    float* x2 = x1 + half;
    for (int64_t i = 0; i < half; ++i) {
        const float a = x1[i], b = x2[i];
        const float ac = a * c[i], bs = b * s[i], bc = b * c[i], as = a * s[i];
        x1[i] = ac - bs;
        x2[i] = bc + as;
    }
}

// Rows per parallel chunk: enough work (~64k elements) to be worth a thread.
int64_t grain_rows(int64_t row_elems) {
    return std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, row_elems));
}

void check_f32_rows(const lc_tensor* t, const char* what, int ndim) {
    check_tensor(t, what, ndim);
    require(t->device == LC_DEVICE_CPU, std::string(what) + " must live on the CPU");
    require(t->dtype == LC_DTYPE_F32,
            std::string(what) + " must be float32, got " + dtype_name(t->dtype));
}

// The weight as contiguous fp32: w's own memory when it already is, else a copy in buf.
const float* widened(const lc_tensor* w, const char* what, int64_t n, std::vector<float>& buf) {
    check_tensor(w, what, 1);
    require(w->device == LC_DEVICE_CPU, std::string(what) + " must live on the CPU");
    require(w->shape[0] == n, std::string(what) + " must have " + std::to_string(n) +
                                  " elements, got " + std::to_string(w->shape[0]));
    require(w->dtype == LC_DTYPE_F32 || w->dtype == LC_DTYPE_BF16,
            std::string(what) + " must be float32 or bfloat16");
    if (w->dtype == LC_DTYPE_F32 && (w->strides[0] == 1 || n <= 1))
        return static_cast<const float*>(w->data);
    buf.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
        buf[size_t(i)] = w->dtype == LC_DTYPE_F32
                           ? static_cast<const float*>(w->data)[i * w->strides[0]]
                           : bf16_to_f32(static_cast<const uint16_t*>(w->data)[i * w->strides[0]]);
    return buf.data();
}

float* row(const lc_tensor* t, int64_t r) {
    return static_cast<float*>(t->data) + r * t->strides[0];
}

}  // namespace

const Kernels& scalar_kernels() {
    static const Kernels k{rms_row_scalar, silu_mul_row_scalar, rope_head_scalar};
    return k;
}

const Kernels& kernels() {
    const Isa isa = current_isa();
    return isa == Isa::kAvx512 ? avx512_kernels()
           : isa == Isa::kAvx2 ? avx2_kernels()
                               : scalar_kernels();
}

Isa set_isa(Isa isa) { return isa_setting().set(isa); }
Isa current_isa() { return isa_setting().current(); }

}  // namespace lc::elementwise

using namespace lc;
using namespace lc::elementwise;

extern "C" lc_status lc_rms_norm(const lc_tensor* x, const lc_tensor* residual,
                                 const lc_tensor* weight, float eps, const lc_tensor* out) {
    return guard([&] {
        check_f32_rows(x, "x", 2);
        check_f32_rows(out, "out", 2);
        const int64_t T = x->shape[0], H = x->shape[1];
        require(out->shape[0] == T && out->shape[1] == H, "out must have the shape of x");
        if (residual) {
            check_f32_rows(residual, "residual", 2);
            require(residual->shape[0] == T && residual->shape[1] == H,
                    "residual must have the shape of x");
            require(!overlaps(*residual, *x) && !overlaps(*residual, *out),
                    "residual must not overlap x or out");
        }
        // out may be x itself (in place, row by row), or apart from it, never half-over it.
        const bool same = out->data == x->data && out->strides[0] == x->strides[0];
        require(same || !overlaps(*out, *x), "out must be x or not overlap it");
        require(eps >= 0.0f && std::isfinite(eps), "eps must be finite and >= 0");
        std::vector<float> buf;
        const float* w = widened(weight, "weight", H, buf);
        if (T == 0 || H == 0) return;
        const RmsRowFn fn = kernels().rms_row;
        parallel_for(T, grain_rows(H), [&](int64_t b, int64_t e) {
            for (int64_t t = b; t < e; ++t)
                fn(row(x, t), residual ? row(residual, t) : nullptr, w, eps, H, row(out, t));
        });
    });
}

extern "C" lc_status lc_silu_mul(const lc_tensor* x, const lc_tensor* out) {
    return guard([&] {
        check_f32_rows(x, "x", 2);
        check_f32_rows(out, "out", 2);
        const int64_t T = x->shape[0], I = x->shape[1] / 2;
        require(x->shape[1] % 2 == 0, "x must be [T, 2 * I] (gate, then up)");
        require(out->shape[0] == T && out->shape[1] == I, "out must be [T, I] for x [T, 2 * I]");
        if (T == 0 || I == 0) return;
        const SiluMulRowFn fn = kernels().silu_mul_row;
        parallel_for(T, grain_rows(I), [&](int64_t b, int64_t e) {
            for (int64_t t = b; t < e; ++t) {
                const float* g = row(x, t);
                fn(g, g + I, I, row(out, t));
            }
        });
    });
}

namespace {

void check_heads(const lc_tensor* t, const char* what, int64_t T, int64_t D) {
    check_tensor(t, what, 3);
    require(t->device == LC_DEVICE_CPU, std::string(what) + " must live on the CPU");
    require(t->dtype == LC_DTYPE_F32, std::string(what) + " must be float32");
    require(t->shape[0] == T, std::string(what) + " must have one row per token");
    require(t->shape[2] == D, std::string(what) + " head size must be " + std::to_string(D));
}

void rotate(const lc_tensor* x, int64_t t, const float* c, const float* s, int64_t half,
            RopeHeadFn fn) {
    float* base = static_cast<float*>(x->data) + t * x->strides[0];
    for (int64_t h = 0; h < x->shape[1]; ++h) fn(base + h * x->strides[1], c, s, half);
}

}  // namespace

extern "C" lc_status lc_rope(const lc_tensor* q, const lc_tensor* k, const lc_tensor* cos,
                             const lc_tensor* sin) {
    return guard([&] {
        check_f32_rows(cos, "cos", 2);
        check_f32_rows(sin, "sin", 2);
        const int64_t T = cos->shape[0], half = cos->shape[1];
        require(sin->shape[0] == T && sin->shape[1] == half, "sin must have the shape of cos");
        check_heads(q, "q", T, 2 * half);
        if (k) check_heads(k, "k", T, 2 * half);
        if (T == 0) return;
        const RopeHeadFn fn = kernels().rope_head;
        parallel_for(T, grain_rows(half * 2 * (q->shape[1] + (k ? k->shape[1] : 0))),
                     [&](int64_t b, int64_t e) {
                         for (int64_t t = b; t < e; ++t) {
                             const float* c = static_cast<const float*>(cos->data) + t * cos->strides[0];
                             const float* s = static_cast<const float*>(sin->data) + t * sin->strides[0];
                             rotate(q, t, c, s, half, fn);
                             if (k) rotate(k, t, c, s, half, fn);
                         }
                     });
    });
}
