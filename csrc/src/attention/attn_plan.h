// The per-step attention plan: the validated, owned copy of lc_attn_metadata
// that every layer's kv_store / paged_attention call reads.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "llmcore/llmcore.h"

struct lc_attn_plan {
    int32_t device = LC_DEVICE_CPU;
    int32_t num_seqs = 0;
    int32_t num_tokens = 0;
    int32_t max_blocks_per_seq = 0;
    int32_t num_blocks = 0;      // bound on block ids (0 = unchecked)
    int32_t max_query_len = 0;   // max over sequences of their query count
    int32_t max_seq_len = 0;     // max over sequences of seq_lens
    std::vector<int32_t> query_start;   // [num_seqs + 1]
    std::vector<int32_t> seq_lens;      // [num_seqs]
    std::vector<int32_t> block_tables;  // [num_seqs * max_blocks_per_seq]
    std::vector<int64_t> slot_mapping;  // [num_tokens]
    std::vector<int32_t> token_seq;     // [num_tokens]: the sequence owning each query row
    bool has_slot_mapping = false;      // false: the host passed no slot_mapping (no kv_store)
    int64_t max_slot = -1;              // largest slot in slot_mapping (-1: none stored)
    int32_t max_block_id = -1;          // largest id in block_tables

    // Cache geometry (block_size << 32 | num_blocks) whose block-table check
    // passed last; a step's layers share one geometry, so the O(blocks)
    // check runs once per plan. 0 = none yet.
    mutable std::atomic<uint64_t> checked_geometry{0};

    // Device copies (CUDA plans only), owned by the plan; one allocation.
    void* device_buffer = nullptr;
    int32_t* d_query_start = nullptr;
    int32_t* d_seq_lens = nullptr;
    int32_t* d_block_tables = nullptr;
    int64_t* d_slot_mapping = nullptr;
    int32_t* d_token_seq = nullptr;
};
