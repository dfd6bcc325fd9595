// Hostile sizes at the C ABI: a host that passes sizes whose products wrap,
// dimensions past int32 or sequence lengths near INT32_MAX gets
// LC_ERR_INVALID_ARGUMENT, never a crash, an undersized buffer or a call that
// runs on a narrowed geometry. Each case also runs a sane call beside it, so a
// check that refused everything would fail here too.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "llmcore/llmcore.h"
#include "tensors.h"

namespace {

using lctest::contiguous;

bool error_names(const char* what) {
    const char* e = lc_last_error();
    return e != nullptr && std::strstr(e, what) != nullptr;
}

// ---- lc_weight_pack_quant ------------------------------------------------------

void pack_quant_sizes() {
    std::vector<uint8_t> blocks(34 * 16, 0);  // 16 rows of one Q8_0 block each
    lc_weight* w = nullptr;
    CHECK(lc_weight_pack_quant(LC_QUANT_Q8_0, blocks.data(), int64_t(blocks.size()), 16, 32, &w) ==
              LC_OK,
          "a sane pack failed: %s", lc_last_error());
    lc_weight_destroy(w);

    struct Hostile {
        const char* name;
        int32_t type;
        int64_t nbytes, n, k;
    };
    const Hostile cases[] = {
        // n * K/32 * 34 and the packed size both wrap to exactly 0 bytes: before the
        // check, a 0-byte buffer was allocated and 2^58 panels were written into it.
        {"n = 2^62, both sizes wrap to 0", LC_QUANT_Q8_0, 0, int64_t(1) << 62, 64},
        {"q4_0 n = 2^60, both sizes wrap to 0", LC_QUANT_Q4_0, 0, int64_t(1) << 60, 16 * 32},
        // K/32 * 34 wraps negative; nbytes equal to the wrapped product.
        {"K = 2^63 - 32: row size wraps", LC_QUANT_Q8_0,
         int64_t(uint64_t(INT64_MAX / 32) * 34u), 1, INT64_MAX / 32 * 32},
        {"K = 32 * 2^58: row size wraps", LC_QUANT_Q8_0, int64_t((uint64_t(1) << 58) * 34u), 1,
         int64_t(32) << 58},
        {"n = INT64_MAX", LC_QUANT_Q4_1, INT64_MAX, INT64_MAX, 32},
        {"negative nbytes", LC_QUANT_Q8_0, -34, 1, 32},
    };
    for (const Hostile& c : cases) {
        w = nullptr;
        const lc_status st = lc_weight_pack_quant(c.type, blocks.data(), c.nbytes, c.n, c.k, &w);
        CHECK(st == LC_ERR_INVALID_ARGUMENT, "%s: status %d (%s)", c.name, int(st),
              lc_last_error());
        CHECK(w == nullptr, "%s: a weight came back", c.name);
        if (w) lc_weight_destroy(w);
    }
}

// ---- paged attention and the KV store -------------------------------------------

struct OneSeq {
    std::vector<int32_t> query_start{0, 1}, seq_lens{1}, block_tables{0};
    int32_t max_blocks_per_seq = 1;
    std::vector<int64_t> slots{0};
    lc_attn_plan* plan = nullptr;

    lc_status create() {
        lc_attn_metadata md{};
        md.num_seqs = 1;
        md.num_tokens = 1;
        md.query_start = query_start.data();
        md.seq_lens = seq_lens.data();
        md.block_tables = block_tables.data();
        md.max_blocks_per_seq = max_blocks_per_seq;
        md.slot_mapping = slots.data();
        return lc_attn_plan_create(&md, LC_DEVICE_CPU, 0, nullptr, &plan);
    }
    ~OneSeq() { lc_attn_plan_destroy(plan); }
};

void head_size_past_int32() {
    // Caches that claim head_size 2^32 + 64: narrowed to int32 it read as 64, a
    // supported size, and the call ran on that geometry.
    const int64_t huge = (int64_t(1) << 32) + 64;
    std::vector<float> kc(16 * 64, 0.0f), vc(16 * 64, 0.0f), q(64, 0.5f), out(64, 0.0f);
    OneSeq s;
    CHECK(s.create() == LC_OK, "plan: %s", lc_last_error());
    lc_attn_params p{0.125f, 0, 0.0f};
    lc_tensor k_ok = contiguous(kc.data(), LC_DTYPE_F32, {1, 1, 16, 64});
    lc_tensor v_ok = contiguous(vc.data(), LC_DTYPE_F32, {1, 1, 16, 64});
    lc_tensor qt = contiguous(q.data(), LC_DTYPE_F32, {1, 1, 64});
    lc_tensor ot = contiguous(out.data(), LC_DTYPE_F32, {1, 1, 64});
    CHECK(lc_kv_store(s.plan, &qt, &qt, &k_ok, &v_ok, nullptr) == LC_OK, "%s", lc_last_error());
    CHECK(lc_paged_attention(s.plan, &qt, &k_ok, &v_ok, &ot, &p, nullptr) == LC_OK, "%s",
          lc_last_error());

    lc_tensor k_bad = contiguous(kc.data(), LC_DTYPE_F32, {1, 1, 16, huge});
    lc_tensor v_bad = contiguous(vc.data(), LC_DTYPE_F32, {1, 1, 16, huge});
    lc_status st = lc_paged_attention(s.plan, &qt, &k_bad, &v_bad, &ot, &p, nullptr);
    CHECK(st == LC_ERR_INVALID_ARGUMENT && error_names("head_size"),
          "paged_attention, head_size 2^32 + 64: status %d (%s)", int(st), lc_last_error());
    st = lc_kv_store(s.plan, &qt, &qt, &k_bad, &v_bad, nullptr);
    CHECK(st == LC_ERR_INVALID_ARGUMENT && error_names("head_size"),
          "kv_store, head_size 2^32 + 64: status %d (%s)", int(st), lc_last_error());
    // q and out that claim it too (their product of dims overflows nothing here)
    lc_tensor q_bad = contiguous(q.data(), LC_DTYPE_F32, {1, 1, huge});
    st = lc_paged_attention(s.plan, &q_bad, &k_ok, &v_ok, &ot, &p, nullptr);
    CHECK(st == LC_ERR_INVALID_ARGUMENT, "q head_size 2^32 + 64: status %d", int(st));

    // Dimensions whose product does not fit int64.
    const int64_t big = int64_t(1) << 40;
    lc_tensor k_wide = contiguous(kc.data(), LC_DTYPE_F32, {big, big, 16, 64});
    k_wide.strides[0] = 16 * 64;  // any strides: the element count is checked first
    k_wide.strides[1] = 16 * 64;
    lc_tensor v_wide = k_wide;
    v_wide.data = vc.data();
    st = lc_paged_attention(s.plan, &qt, &k_wide, &v_wide, &ot, &p, nullptr);
    CHECK(st == LC_ERR_INVALID_ARGUMENT, "cache [2^40, 2^40, 16, 64]: status %d", int(st));
    lc_tensor q_wide = contiguous(q.data(), LC_DTYPE_F32, {1, big, big});
    q_wide.strides[0] = 64;
    q_wide.strides[1] = 64;
    st = lc_paged_attention(s.plan, &q_wide, &k_ok, &v_ok, &ot, &p, nullptr);
    CHECK(st == LC_ERR_INVALID_ARGUMENT, "q [1, 2^40, 2^40]: status %d", int(st));
}

void seq_len_near_int32_max() {
    // One sequence of INT32_MAX - 10 tokens over blocks of 1024: its block count,
    // (seq_len + block_size - 1) / block_size, overflowed int32, so no block id of
    // its row was checked, and the kernel read the ids below (all past the
    // one-block cache) as it walked the context.
    const int32_t block = 1024;
    std::vector<float> kc(size_t(block) * 64, 0.0f), vc(kc.size(), 0.0f), q(64, 0.5f),
        out(64, 0.0f);
    OneSeq s;
    s.max_blocks_per_seq = int32_t((int64_t(INT32_MAX) + block - 1) / block);  // 2^21
    s.block_tables.resize(size_t(s.max_blocks_per_seq));
    for (size_t i = 0; i < s.block_tables.size(); ++i) s.block_tables[i] = int32_t(i) + 1;
    s.seq_lens[0] = INT32_MAX - 10;
    CHECK(s.create() == LC_OK, "plan: %s", lc_last_error());
    lc_attn_params p{0.125f, 0, 0.0f};
    lc_tensor kt = contiguous(kc.data(), LC_DTYPE_F32, {1, 1, block, 64});
    lc_tensor vt = contiguous(vc.data(), LC_DTYPE_F32, {1, 1, block, 64});
    lc_tensor qt = contiguous(q.data(), LC_DTYPE_F32, {1, 1, 64});
    lc_tensor ot = contiguous(out.data(), LC_DTYPE_F32, {1, 1, 64});
    const lc_status st = lc_paged_attention(s.plan, &qt, &kt, &vt, &ot, &p, nullptr);
    CHECK(st == LC_ERR_INVALID_ARGUMENT, "seq_len INT32_MAX - 10: status %d (%s)", int(st),
          lc_last_error());

    // The same lengths with every id valid: refused by length, before a kernel
    // walks positions whose tile ends pass INT32_MAX.
    OneSeq v;
    v.max_blocks_per_seq = s.max_blocks_per_seq;
    v.block_tables.assign(size_t(v.max_blocks_per_seq), 0);
    v.seq_lens[0] = INT32_MAX;
    CHECK(v.create() == LC_OK, "plan: %s", lc_last_error());
    const lc_status st2 = lc_paged_attention(v.plan, &qt, &kt, &vt, &ot, &p, nullptr);
    CHECK(st2 == LC_ERR_INVALID_ARGUMENT && error_names("tokens"),
          "seq_len INT32_MAX, valid ids: status %d (%s)", int(st2), lc_last_error());

    // A short sequence over the same geometry still runs.
    OneSeq ok;
    ok.seq_lens[0] = 1;
    CHECK(ok.create() == LC_OK, "plan: %s", lc_last_error());
    CHECK(lc_paged_attention(ok.plan, &qt, &kt, &vt, &ot, &p, nullptr) == LC_OK, "%s",
          lc_last_error());
}

}  // namespace

int main() {
    pack_quant_sizes();
    head_size_past_int32();
    seq_len_near_int32_max();
    return lctest::finish();
}
