// The C entry points of the sampler: lc_sample and lc_rng_uniform.
#include <exception>
#include <mutex>
#include <string>

#include "runtime/cuda_api.h"
#include "runtime/internal.h"
#include "sampling/rng.h"
#include "sampling/sampling_kernels.h"
#include "sampling/sampling_row.h"

extern "C" {

lc_status lc_sample(const lc_tensor* logits, const lc_sampling_batch* batch, void* stream,
                    lc_sample_output* out) {
    return lc::guard([&] {
        // An empty batch is valid even when its (empty) logits have no storage.
        if (batch && out && logits && batch->num_rows == 0 && logits->ndim == 2 &&
            logits->shape[0] == 0)
            return;
        lc::sampling::validate(logits, batch, out);
        if (logits->device == LC_DEVICE_CUDA) {
#if defined(LLMCORE_WITH_CUDA)
            lc::cuda::sample(*logits, *batch, stream, *out);
            return;
#else
            lc::fail(LC_ERR_UNSUPPORTED,
                     "lc_sample: CUDA logits, but llmcore was built without CUDA");
#endif
        }
        const lc::sampling::Kernels& k = lc::sampling::kernels();
        const lc_sample_output o = *out;
        const lc_sampling_batch& b = *batch;
        // Rows cannot fail after validation except on allocation; carry the
        // first exception out of the workers instead of letting it escape them.
        std::mutex mu;
        std::exception_ptr error;
        lc::parallel_for(batch->num_rows, 1, [&](int64_t begin, int64_t end) {
            try {
                for (int64_t r = begin; r < end; ++r) lc::sampling::sample_row(k, *logits, b, r, o);
            } catch (...) {
                std::lock_guard<std::mutex> lock(mu);
                if (!error) error = std::current_exception();
            }
        });
        if (error) std::rethrow_exception(error);
    });
}

float lc_rng_uniform(uint64_t seed, int64_t position, uint32_t index) {
    return lc::rng::uniform(seed, position, index);
}

}  // extern "C"
