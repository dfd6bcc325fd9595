// One row of the CPU sampler: processing pipeline, filtering, draw and
// logprobs. Called from lc_sample after the whole batch has been validated.
#pragma once

#include <cstdint>

#include "llmcore/llmcore.h"
#include "sampling/sampling_kernels.h"

namespace lc::sampling {

// Checks everything lc_sample needs before touching any row; throws
// lc::Error(LC_ERR_INVALID_ARGUMENT) with a message naming the field.
void validate(const lc_tensor* logits, const lc_sampling_batch* batch,
              const lc_sample_output* out);

// Samples row r of logits and writes its outputs. Thread-safe (per-thread
// scratch); rows are independent.
void sample_row(const Kernels& k, const lc_tensor& logits, const lc_sampling_batch& batch,
                int64_t r, const lc_sample_output& out);

}  // namespace lc::sampling
