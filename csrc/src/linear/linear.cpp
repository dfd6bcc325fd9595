// lc_linear: argument validation (the one place), bias widening, and the
// run-time choice of instruction set (LLMCORE_LINEAR_ISA=scalar|avx2 caps it,
// for testing and benchmarking).
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "linear/linear.h"
#include "linear/linear_quant.h"

namespace lc::linear {

namespace {

// "avx512" is the AVX512_BF16 kernel for packed bf16 weights and "amx" the tile
// kernel (linear.h), so a CPU without AVX512_BF16 runs the AVX2 kernels at most.
// LLMCORE_LINEAR_ISA=scalar|avx2|avx512 caps the choice.
bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

IsaSetting& isa_setting() {
    static IsaSetting setting("LLMCORE_LINEAR_ISA",
                              cpu_has_avx512_bf16() ? Isa::kAmx : Isa::kAvx2);
    return setting;
}

std::string shape_str(const lc_tensor& t) {
    std::string s = "[";
    for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
    return s + "]";
}

void validate_io(const lc_tensor* x, int64_t N, int64_t K, const lc_tensor* bias,
                 const lc_tensor* out);

// What both entry points need of x, out and bias (and of a row-major weight w when
// given): present, on the CPU, 2-D, and of a supported dtype.
void validate_x_out(const char* fn, const lc_tensor* x, const lc_tensor* w, const lc_tensor* bias,
                    const lc_tensor* out) {
    for (const lc_tensor* t : {x, w, bias, out})
        if (t && t->device == LC_DEVICE_CUDA)
            fail(LC_ERR_UNSUPPORTED, std::string(fn) + ": CUDA tensors are not supported yet");
    for (const lc_tensor* t : {x, w, bias, out})
        if (t) require(t->device == LC_DEVICE_CPU, std::string(fn) + ": tensors must live on the CPU");
    check_tensor(x, "x", 2);
    check_tensor(out, "out", 2);
    require(x->dtype == LC_DTYPE_F32, "x must be float32, got " + std::string(dtype_name(x->dtype)));
    require(out->dtype == LC_DTYPE_F32 || out->dtype == LC_DTYPE_BF16,
            "out must be float32 or bfloat16, got " + std::string(dtype_name(out->dtype)));
}

void validate(const lc_tensor* x, const lc_tensor* w, const lc_tensor* bias,
              const lc_tensor* out) {
    require(x && w && out, "x, weight and out are required");
    validate_x_out("lc_linear", x, w, bias, out);
    check_tensor(w, "weight", 2);
    require(w->dtype == LC_DTYPE_F32 || w->dtype == LC_DTYPE_BF16,
            "weight must be bfloat16 or float32, got " + std::string(dtype_name(w->dtype)));
    require(is_contiguous(*w), "weight must be contiguous");
    const int64_t K = x->shape[1], N = w->shape[0];
    require(w->shape[1] == K, "weight " + shape_str(*w) + " does not match x " + shape_str(*x) +
                                  ": expected [N, " + std::to_string(K) + "]");
    validate_io(x, N, K, bias, out);
    require(!overlaps(*w, *out), "out must not overlap the inputs");
}

void validate_io(const lc_tensor* x, int64_t N, int64_t K, const lc_tensor* bias,
                 const lc_tensor* out) {
    const int64_t M = x->shape[0];
    require(out->shape[0] == M && out->shape[1] == N,
            "out " + shape_str(*out) + " must be [" + std::to_string(M) + ", " +
                std::to_string(N) + "]");
    require(M <= 1 || x->strides[0] >= K, "x rows overlap (row stride < K)");
    require(M <= 1 || out->strides[0] >= N, "out rows overlap (row stride < N)");
    if (bias) {
        check_tensor(bias, "bias", 1);
        require(bias->dtype == LC_DTYPE_F32 || bias->dtype == LC_DTYPE_BF16,
                "bias must be float32 or bfloat16, got " + std::string(dtype_name(bias->dtype)));
        require(bias->shape[0] == N, "bias " + shape_str(*bias) + " must be [" +
                                         std::to_string(N) + "]");
    }
    for (const lc_tensor* t : {x, bias})
        if (t) require(!overlaps(*t, *out), "out must not overlap the inputs");
}

}  // namespace

void dispatch(const Job& job) {
    if (job.packed && job.packed->qtype) return run_quant(job);
    const Isa isa = current_isa();
    const bool avx2 = isa >= Isa::kAvx2;
    if (job.packed && isa == Isa::kAmx && job.packed->dtype == LC_DTYPE_BF16 &&
        job.kernel != LC_LINEAR_KERNEL_DOT)
        run_packed_bf16_amx(job);
    else if (job.packed && isa >= Isa::kAvx512 && job.packed->dtype == LC_DTYPE_BF16)
        run_packed_bf16_avx512(job);
    else if (job.packed)
        avx2 ? run_packed_avx2(job) : run_packed_scalar(job);
    else
        avx2 ? run_avx2(job) : run_scalar(job);
}

Isa best_isa() { return isa_setting().best(); }
Isa set_isa(Isa isa) { return isa_setting().set(isa); }
Isa current_isa() { return isa_setting().current(); }

}  // namespace lc::linear

namespace lc::linear {
namespace {

// Fills the bias of a job (widening a bf16 or strided one into bias32) and runs it.
void run(Job& job, const lc_tensor* bias, std::vector<float>& bias32) {
    if (job.M == 0 || job.N == 0) return;
    if (bias) {
        const int64_t bs = bias->strides[0];
        if (bias->dtype == LC_DTYPE_F32 && (bs == 1 || job.N == 1)) {
            job.bias = static_cast<const float*>(bias->data);
        } else {
            bias32.resize(size_t(job.N));
            for (int64_t n = 0; n < job.N; ++n)
                bias32[size_t(n)] =
                    bias->dtype == LC_DTYPE_F32
                        ? static_cast<const float*>(bias->data)[n * bs]
                        : lc::bf16_to_f32(static_cast<const uint16_t*>(bias->data)[n * bs]);
            job.bias = bias32.data();
        }
    }
    dispatch(job);
}

Job job_for(const lc_tensor* x, const lc_tensor* out) {
    Job job{};
    job.x = static_cast<const float*>(x->data);
    job.ldx = x->strides[0];
    job.out = out->data;
    job.ldo = out->strides[0];
    job.out_dtype = out->dtype;
    job.M = x->shape[0];
    job.K = x->shape[1];
    return job;
}

}  // namespace
}  // namespace lc::linear

extern "C" lc_status lc_linear(const lc_tensor* x, const lc_tensor* weight, const lc_tensor* bias,
                               const lc_tensor* out, void* stream) {
    return lc::guard([&] {
        using namespace lc::linear;
        validate(x, weight, bias, out);
        Job job = job_for(x, out);
        job.w = weight->data;
        job.w_dtype = weight->dtype;
        job.N = weight->shape[0];
        std::vector<float> bias32;
        run(job, bias, bias32);
    });
}

extern "C" lc_status lc_linear_packed(const lc_tensor* x, const lc_weight* weight,
                                      const lc_tensor* bias, const lc_tensor* out, void* stream) {
    return lc_linear_packed_kernel(x, weight, bias, out, LC_LINEAR_KERNEL_AUTO, stream);
}

extern "C" lc_status lc_linear_packed_kernel(const lc_tensor* x, const lc_weight* weight,
                                             const lc_tensor* bias, const lc_tensor* out,
                                             int32_t kernel, void* stream) {
    return lc::guard([&] {
        using namespace lc;
        using namespace lc::linear;
        require(x && weight && out, "x, weight and out are required");
        validate_x_out("lc_linear_packed", x, nullptr, bias, out);
        require(x->shape[1] == weight->k, "x " + shape_str(*x) + " does not match the packed weight [" +
                                              std::to_string(weight->n) + ", " +
                                              std::to_string(weight->k) + "]");
        validate_io(x, weight->n, weight->k, bias, out);
        require(kernel == LC_LINEAR_KERNEL_AUTO || kernel == LC_LINEAR_KERNEL_DOT ||
                    kernel == LC_LINEAR_KERNEL_TILES,
                "kernel must be LC_LINEAR_KERNEL_AUTO, _DOT or _TILES, got " + std::to_string(kernel));
        Job job = job_for(x, out);
        job.packed = weight;
        job.kernel = kernel;
        job.w = weight->data;
        job.w_dtype = weight->dtype;
        job.N = weight->n;
        std::vector<float> bias32;
        run(job, bias, bias32);
    });
}
