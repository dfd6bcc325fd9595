// Validation of a whole lc_sample call, shared by the CPU and CUDA paths:
// nothing is read from a row before every row has been checked.
#include <cmath>
#include <string>

#include "runtime/internal.h"
#include "sampling/sampling_row.h"

namespace lc::sampling {

namespace {

std::string row_field(int64_t r, const char* field) {
    return "sampling row " + std::to_string(r) + ": " + field;
}

// A CSR list: offsets[0..num_rows] non-decreasing from >= 0, ids in [0, vocab).
void check_csr(const char* name, const int32_t* offsets, const int32_t* ids, int32_t num_rows,
               int64_t vocab) {
    if (!offsets) return;
    const std::string n(name);
    require(offsets[0] >= 0, n + "_offsets[0] must be >= 0");
    for (int32_t r = 0; r < num_rows; ++r)
        require(offsets[r + 1] >= offsets[r], n + "_offsets must be non-decreasing (row " +
                                                  std::to_string(r) + ")");
    require(offsets[num_rows] == offsets[0] || ids != nullptr,
            n + "_tokens is NULL but the offsets are not empty");
    for (int32_t i = offsets[0]; i < offsets[num_rows]; ++i)
        require(ids[i] >= 0 && ids[i] < vocab, n + " token id " + std::to_string(ids[i]) +
                                                   " is outside [0, " + std::to_string(vocab) +
                                                   ")");
}

void check_row(const lc_sampling_row& p, int64_t r) {
    require(std::isfinite(p.temperature), row_field(r, "temperature must be finite"));
    require(p.top_p > 0.0f && p.top_p <= 1.0f, row_field(r, "top_p must be in (0, 1]"));
    require(p.min_p >= 0.0f && p.min_p <= 1.0f, row_field(r, "min_p must be in [0, 1]"));
    require(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f,
            row_field(r, "repetition_penalty must be finite and > 0"));
    require(std::isfinite(p.presence_penalty), row_field(r, "presence_penalty must be finite"));
    require(std::isfinite(p.frequency_penalty), row_field(r, "frequency_penalty must be finite"));
}

}  // namespace

void validate(const lc_tensor* logits, const lc_sampling_batch* b, const lc_sample_output* out) {
    require(b != nullptr, "lc_sample: batch is NULL");
    require(out != nullptr, "lc_sample: out is NULL");
    check_tensor(logits, "logits", 2);
    require(logits->dtype == LC_DTYPE_F32 || logits->dtype == LC_DTYPE_BF16,
            std::string("logits must be float32 or bfloat16, got ") + dtype_name(logits->dtype));
    require(logits->device == LC_DEVICE_CPU || logits->device == LC_DEVICE_CUDA,
            "logits lives on an unknown device");
    require(b->num_rows >= 0, "num_rows must be >= 0");
    require(logits->shape[0] == b->num_rows,
            "logits has " + std::to_string(logits->shape[0]) + " rows but the batch has " +
                std::to_string(b->num_rows));
    const int64_t vocab = logits->shape[1];
    require(vocab >= 1 && vocab <= INT32_MAX, "logits vocab size must be in [1, 2^31)");
    // Any row stride works, 0 included (one row broadcast to many draws):
    // logits are only read.
    require(b->num_rows == 0 || b->rows != nullptr, "batch rows is NULL");
    require(out->tokens != nullptr || b->num_rows == 0, "out tokens is NULL");
    require(b->num_top_logprobs >= 0 && b->num_top_logprobs <= vocab,
            "num_top_logprobs must be in [0, vocab size " + std::to_string(vocab) + "]");
    require(b->num_top_logprobs == 0 || (out->top_tokens && out->top_logprobs) ||
                b->num_rows == 0,
            "num_top_logprobs > 0 needs out top_tokens and top_logprobs");
    require(b->logprobs_mode == LC_LOGPROBS_RAW || b->logprobs_mode == LC_LOGPROBS_PROCESSED,
            "logprobs_mode must be LC_LOGPROBS_RAW or LC_LOGPROBS_PROCESSED");

    bool any_bitmask = false;
    for (int32_t r = 0; r < b->num_rows; ++r) {
        check_row(b->rows[r], r);
        any_bitmask |= b->rows[r].use_bitmask != 0;
    }
    if (any_bitmask) {
        require(b->allowed_bitmask != nullptr,
                "a row sets use_bitmask but allowed_bitmask is NULL");
        require(int64_t(b->bitmask_words) * 32 >= vocab,
                "bitmask_words " + std::to_string(b->bitmask_words) + " is too small for vocab " +
                    std::to_string(vocab) + " (needs ceil(vocab / 32))");
    }
    check_csr("prompt", b->prompt_offsets, b->prompt_tokens, b->num_rows, vocab);
    check_csr("output", b->output_offsets, b->output_tokens, b->num_rows, vocab);
    check_csr("banned", b->banned_offsets, b->banned_tokens, b->num_rows, vocab);
    check_csr("bias", b->bias_offsets, b->bias_tokens, b->num_rows, vocab);
    check_csr("logprob", b->logprob_offsets, b->logprob_ids, b->num_rows, vocab);
    require(!b->logprob_offsets || b->logprob_offsets[b->num_rows] == b->logprob_offsets[0] ||
                out->listed_logprobs != nullptr,
            "logprob_offsets lists ids but out listed_logprobs is NULL");
    if (b->bias_offsets) {
        const int32_t end = b->bias_offsets[b->num_rows];
        require(end == b->bias_offsets[0] || b->bias_values != nullptr, "bias_values is NULL");
        for (int32_t i = b->bias_offsets[0]; i < end; ++i)
            require(std::isfinite(b->bias_values[i]), "bias value at " + std::to_string(i) +
                                                          " must be finite");
    }
}

}  // namespace lc::sampling
