// Uploading a step's attention plan: the host arrays are packed into one
// staging vector and copied with one cudaMemcpyAsync into one device buffer.
//
//   device_buffer: | query_start | seq_lens | block_tables | token_seq | slot_mapping |
//                  each section starts on a 16-byte boundary
#include <cstring>
#include <vector>

#include "attention/attn_plan.h"
#include "cuda_util.cuh"
#include "runtime/cuda_api.h"

namespace lc::cuda {

namespace {
size_t align16(size_t n) { return (n + 15) & ~size_t(15); }

template <class T>
size_t section_bytes(const std::vector<T>& v) {
    return align16(v.size() * sizeof(T));
}
}  // namespace

void plan_upload(lc_attn_plan* plan, void* stream) {
    require(plan != nullptr, "plan is NULL");
    plan_release(plan);
    const size_t off_qs = 0;
    const size_t off_sl = off_qs + section_bytes(plan->query_start);
    const size_t off_bt = off_sl + section_bytes(plan->seq_lens);
    const size_t off_ts = off_bt + section_bytes(plan->block_tables);
    const size_t off_sm = off_ts + section_bytes(plan->token_seq);
    const size_t total = off_sm + section_bytes(plan->slot_mapping);
    if (total == 0) return;  // an empty step: nothing for a kernel to read

    // Pageable source: cudaMemcpyAsync returns once the bytes are staged, so
    // the vector may die right after the call.
    std::vector<unsigned char> host(total, 0);
    auto put = [&](size_t off, const void* src, size_t n) {
        if (n) std::memcpy(host.data() + off, src, n);
    };
    put(off_qs, plan->query_start.data(), plan->query_start.size() * sizeof(int32_t));
    put(off_sl, plan->seq_lens.data(), plan->seq_lens.size() * sizeof(int32_t));
    put(off_bt, plan->block_tables.data(), plan->block_tables.size() * sizeof(int32_t));
    put(off_ts, plan->token_seq.data(), plan->token_seq.size() * sizeof(int32_t));
    put(off_sm, plan->slot_mapping.data(), plan->slot_mapping.size() * sizeof(int64_t));

    const cudaStream_t s = as_stream(stream);
    void* buf = nullptr;
    LC_CUDA_CHECK(cudaMallocAsync(&buf, total, s));
    const cudaError_t err = cudaMemcpyAsync(buf, host.data(), total, cudaMemcpyHostToDevice, s);
    if (err != cudaSuccess) {
        (void)cudaFreeAsync(buf, s);
        check(err, "cudaMemcpyAsync(plan)");
    }
    auto* base = static_cast<unsigned char*>(buf);
    plan->device_buffer = buf;
    plan->d_query_start = reinterpret_cast<int32_t*>(base + off_qs);
    plan->d_seq_lens = reinterpret_cast<int32_t*>(base + off_sl);
    plan->d_block_tables = reinterpret_cast<int32_t*>(base + off_bt);
    plan->d_token_seq = reinterpret_cast<int32_t*>(base + off_ts);
    plan->d_slot_mapping = reinterpret_cast<int64_t*>(base + off_sm);
}

void plan_release(lc_attn_plan* plan) {
    if (plan == nullptr || plan->device_buffer == nullptr) return;
    // The plan does not remember the streams that read it, so free with
    // cudaFree, which waits for outstanding work on the device: safe for any
    // stream. (Hosts destroy a plan after the step's results were read back,
    // so this wait is normally already satisfied.) Errors are not thrown:
    // destroy paths cannot report them.
    // cudaFree acts on the current device: switch to the buffer's owner.
    int prev = -1, owner = -1;
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, plan->device_buffer) == cudaSuccess) owner = attr.device;
    if (owner >= 0 && cudaGetDevice(&prev) == cudaSuccess && prev != owner)
        (void)cudaSetDevice(owner);
    (void)cudaFree(plan->device_buffer);
    if (owner >= 0 && prev >= 0 && prev != owner) (void)cudaSetDevice(prev);
    (void)cudaGetLastError();
    plan->device_buffer = nullptr;
    plan->d_query_start = nullptr;
    plan->d_seq_lens = nullptr;
    plan->d_block_tables = nullptr;
    plan->d_slot_mapping = nullptr;
    plan->d_token_seq = nullptr;
}

}  // namespace lc::cuda
