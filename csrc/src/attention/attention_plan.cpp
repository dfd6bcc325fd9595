// lc_attn_plan_create / lc_attn_plan_destroy: validate the step's metadata
// once and keep an owned copy that every layer's call reads.
#include <algorithm>
#include <memory>
#include <string>

#include "attention/attention_check.h"
#include "attention/attn_plan.h"
#include "runtime/cuda_api.h"
#include "runtime/internal.h"

namespace {

using std::to_string;

// Checks md and copies it into plan. Block ids are bounded by num_blocks when
// it is > 0; negative entries are padding and are rejected only when a call
// reads them (the block size, hence which entries are read, is known then).
void fill_plan(const lc_attn_metadata& md, int32_t num_blocks, lc_attn_plan& p) {
    const int32_t ns = md.num_seqs, nt = md.num_tokens;
    LC_CHECK_ARG(ns >= 0, "num_seqs must be >= 0, got " + to_string(ns));
    LC_CHECK_ARG(nt >= 0, "num_tokens must be >= 0, got " + to_string(nt));
    LC_CHECK_ARG(num_blocks >= 0, "num_blocks must be >= 0, got " + to_string(num_blocks));
    LC_CHECK_ARG(md.query_start != nullptr, "query_start is NULL");
    LC_CHECK_ARG(md.query_start[0] == 0,
                 "query_start[0] must be 0, got " + to_string(md.query_start[0]));
    LC_CHECK_ARG(ns == 0 || md.seq_lens != nullptr, "seq_lens is NULL");
    LC_CHECK_ARG(md.max_blocks_per_seq >= 0,
                 "max_blocks_per_seq must be >= 0, got " + to_string(md.max_blocks_per_seq));

    p.num_seqs = ns;
    p.num_tokens = nt;
    p.num_blocks = num_blocks;
    p.max_blocks_per_seq = md.max_blocks_per_seq;
    p.query_start.assign(md.query_start, md.query_start + ns + 1);
    p.seq_lens.assign(md.seq_lens, md.seq_lens + ns);
    for (int32_t s = 0; s < ns; ++s)
        LC_CHECK_ARG(p.query_start[s + 1] >= p.query_start[s],
                     "query_start must be non-decreasing (query_start[" + to_string(s + 1) +
                         "] = " + to_string(p.query_start[s + 1]) + " < " +
                         to_string(p.query_start[s]) + ")");
    LC_CHECK_ARG(p.query_start[ns] == nt,
                 "query_start[num_seqs] = " + to_string(p.query_start[ns]) +
                     " must equal num_tokens " + to_string(nt));
    p.token_seq.resize(size_t(nt));
    for (int32_t s = 0; s < ns; ++s) {
        const int32_t b = p.query_start[s], e = p.query_start[s + 1];
        LC_CHECK_ARG(p.seq_lens[s] >= e - b,
                     "seq_lens[" + to_string(s) + "] = " + to_string(p.seq_lens[s]) +
                         " is less than its " + to_string(e - b) + " query tokens");
        std::fill(p.token_seq.begin() + b, p.token_seq.begin() + e, s);
        p.max_query_len = std::max(p.max_query_len, e - b);
        p.max_seq_len = std::max(p.max_seq_len, p.seq_lens[s]);
    }
    LC_CHECK_ARG(p.max_seq_len == 0 || p.max_blocks_per_seq > 0,
                 "max_blocks_per_seq is 0 but a sequence has context");

    const size_t nbt = size_t(ns) * size_t(md.max_blocks_per_seq);
    LC_CHECK_ARG(nbt == 0 || md.block_tables != nullptr, "block_tables is NULL");
    p.block_tables.assign(md.block_tables, md.block_tables + nbt);
    for (size_t i = 0; i < nbt; ++i) {
        const int32_t id = p.block_tables[i];
        LC_CHECK_ARG(num_blocks == 0 || id < num_blocks,
                     "block id " + to_string(id) + " in block_tables[" +
                         to_string(i / size_t(md.max_blocks_per_seq)) + "][" +
                         to_string(i % size_t(md.max_blocks_per_seq)) + "] is out of range for " +
                         to_string(num_blocks) + " blocks");
        p.max_block_id = std::max(p.max_block_id, id);
    }

    p.has_slot_mapping = md.slot_mapping != nullptr;
    if (p.has_slot_mapping) {
        p.slot_mapping.assign(md.slot_mapping, md.slot_mapping + nt);
        for (int64_t s : p.slot_mapping) p.max_slot = std::max(p.max_slot, s);
    }
}

}  // namespace

extern "C" {

lc_status lc_attn_plan_create(const lc_attn_metadata* md, int32_t device, int32_t num_blocks,
                              void* stream, lc_attn_plan** out) {
    return lc::guard([&] {
        LC_CHECK_ARG(out != nullptr, "out is NULL");
        *out = nullptr;
        LC_CHECK_ARG(md != nullptr, "metadata is NULL");
        LC_CHECK_ARG(device == LC_DEVICE_CPU || device == LC_DEVICE_CUDA,
                     "device must be LC_DEVICE_CPU or LC_DEVICE_CUDA, got " + to_string(device));
        auto plan = std::make_unique<lc_attn_plan>();
        plan->device = device;
        fill_plan(*md, num_blocks, *plan);
        if (device == LC_DEVICE_CUDA) {
#if defined(LLMCORE_WITH_CUDA)
            lc::cuda::plan_upload(plan.get(), stream);
#else
            lc::fail(LC_ERR_UNSUPPORTED, "this llmcore build has no CUDA support");
#endif
        }
        *out = plan.release();
    });
}

void lc_attn_plan_destroy(lc_attn_plan* plan) {
    if (!plan) return;
#if defined(LLMCORE_WITH_CUDA)
    if (plan->device == LC_DEVICE_CUDA) {
        try {
            lc::cuda::plan_release(plan);
        } catch (...) {
            // Destruction cannot report failure; the device memory is lost.
        }
    }
#endif
    delete plan;
}

}  // extern "C"
