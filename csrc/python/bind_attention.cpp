// Python face of the attention core: AttentionPlan (one per step), kv_store
// and paged_attention (once per layer). Arguments are converted while the GIL
// is held; the kernels run with it released.
#include <cstdint>
#include <cstring>
#include <string>

#include "attention/attention_check.h"
#include "attention/attention_cpu.h"
#include "binding.h"

namespace lcpy {

namespace {


// Owns one lc_attn_plan; the per-layer calls borrow it.
class AttentionPlan {
   public:
    AttentionPlan(const py::object& query_start, const py::object& seq_lens,
                  const py::object& block_tables, const py::object& slot_mapping,
                  const py::object& device, int32_t num_blocks, uintptr_t stream) {
        device_ = parse_device(device);
        IntArray<int32_t> qs(query_start, "query_start");
        IntArray<int32_t> sl(seq_lens, "seq_lens");
        IntArray<int64_t> slots(slot_mapping, "slot_mapping");
        if (qs.size() < 1) throw py::value_error("query_start must have num_seqs + 1 entries");
        const int64_t ns = qs.size() - 1;
        if (sl.size() != ns)
            throw py::value_error("seq_lens has " + std::to_string(sl.size()) +
                                  " entries but query_start describes " + std::to_string(ns) +
                                  " sequences");
        auto bt =
            py::array_t<int32_t, py::array::c_style | py::array::forcecast>::ensure(block_tables);
        if (!bt) throw py::type_error("block_tables must be an integer array");
        if (bt.ndim() != 2 || bt.shape(0) != ns)
            throw py::value_error("block_tables must be a 2-D array [num_seqs=" +
                                  std::to_string(ns) + ", max_blocks_per_seq]");
        const int32_t nt = qs.data()[ns];
        if (!slot_mapping.is_none() && slots.size() != nt)
            throw py::value_error("slot_mapping has " + std::to_string(slots.size()) +
                                  " entries but the batch has " + std::to_string(nt) + " tokens");
        lc_attn_metadata md = {int32_t(ns),
                               nt,
                               qs.data(),
                               sl.data(),
                               bt.data(),
                               int32_t(bt.shape(1)),
                               slot_mapping.is_none() ? nullptr : slots.data()};
        lc_status st;
        {
            py::gil_scoped_release nogil;
            st = lc_attn_plan_create(&md, device_, num_blocks, reinterpret_cast<void*>(stream),
                                     &plan_);
        }
        check(st);
        num_seqs_ = int32_t(ns);
        num_tokens_ = nt;
    }
    AttentionPlan(const AttentionPlan&) = delete;
    AttentionPlan& operator=(const AttentionPlan&) = delete;
    ~AttentionPlan() { lc_attn_plan_destroy(plan_); }

    const lc_attn_plan* get() const { return plan_; }
    int32_t num_seqs() const { return num_seqs_; }
    int32_t num_tokens() const { return num_tokens_; }
    std::string device() const { return device_ == LC_DEVICE_CUDA ? "cuda" : "cpu"; }

   private:
    static int32_t parse_device(const py::object& device) {
        const std::string s = py::str(device);
        if (s == "cpu") return LC_DEVICE_CPU;
        if (s == "cuda" || s.rfind("cuda:", 0) == 0) return LC_DEVICE_CUDA;
        throw py::value_error("device must be 'cpu' or 'cuda', got '" + s + "'");
    }

    lc_attn_plan* plan_ = nullptr;
    int32_t device_ = LC_DEVICE_CPU;
    int32_t num_seqs_ = 0, num_tokens_ = 0;
};

void kv_store(const AttentionPlan& plan, const py::handle& k, const py::handle& v,
              const py::handle& k_cache, const py::handle& v_cache, uintptr_t stream) {
    Borrowed bk = borrow(k, "k"), bv = borrow(v, "v");
    Borrowed bkc = borrow(k_cache, "k_cache"), bvc = borrow(v_cache, "v_cache");
    lc_status st;
    {
        py::gil_scoped_release nogil;
        st = lc_kv_store(plan.get(), bk.view(), bv.view(), bkc.view(), bvc.view(),
                         reinterpret_cast<void*>(stream));
    }
    check(st);
}

void paged_attention(const AttentionPlan& plan, const py::handle& q, const py::handle& k_cache,
                     const py::handle& v_cache, const py::handle& out, float scale,
                     int32_t sliding_window, float softcap, uintptr_t stream) {
    Borrowed bq = borrow(q, "q"), bkc = borrow(k_cache, "k_cache");
    Borrowed bvc = borrow(v_cache, "v_cache"), bo = borrow(out, "out");
    const lc_attn_params params = {scale, sliding_window, softcap};
    lc_status st;
    {
        py::gil_scoped_release nogil;
        st = lc_paged_attention(plan.get(), bq.view(), bkc.view(), bvc.view(), bo.view(), &params,
                                reinterpret_cast<void*>(stream));
    }
    check(st);
}

}  // namespace

void bind_attention(py::module_& m) {
    py::class_<AttentionPlan>(m, "AttentionPlan",
                              R"doc(Validated attention metadata of one step, shared by all layers.

query_start: int32 [num_seqs + 1], non-decreasing from 0 to num_tokens;
seq_lens: int32 [num_seqs], each >= its query count; block_tables: int32
[num_seqs, max_blocks_per_seq] (negative entries are padding and must not be
read); slot_mapping: int64 [num_tokens] (negative = do not store) or None.
num_blocks > 0 bounds the block ids. device: "cpu" or "cuda" (the plan is
then uploaded on stream).)doc")
        .def(py::init<const py::object&, const py::object&, const py::object&, const py::object&,
                      const py::object&, int32_t, uintptr_t>(),
             py::arg("query_start"), py::arg("seq_lens"), py::arg("block_tables"),
             py::arg("slot_mapping"), py::arg("device") = "cpu", py::arg("num_blocks") = 0,
             py::arg("stream") = 0)
        .def_property_readonly("num_seqs", &AttentionPlan::num_seqs)
        .def_property_readonly("num_tokens", &AttentionPlan::num_tokens)
        .def_property_readonly("device", &AttentionPlan::device)
        .def("__repr__", [](const AttentionPlan& p) {
            return "AttentionPlan(num_seqs=" + std::to_string(p.num_seqs()) +
                   ", num_tokens=" + std::to_string(p.num_tokens()) + ", device='" + p.device() +
                   "')";
        });
    m.def(
        "attention_isa", [] { return std::string(lc::attn::isa_name(lc::attn::current_isa())); },
        "The instruction set the CPU attention kernel runs with: avx512, avx2 or scalar.");
    m.def(
        "set_attention_isa",
        [](const std::string& name) {
            return std::string(lc::attn::isa_name(lc::attn::set_isa(isa_arg(name))));
        },
        py::arg("isa"),
        "Caps the CPU attention kernel's instruction set (tests); returns the one in effect.");
    m.def("kv_store", &kv_store, py::arg("plan"), py::arg("k"), py::arg("v"), py::arg("k_cache"),
          py::arg("v_cache"), py::arg("stream") = 0,
          R"doc(Write the step's new K/V rows into their slots of the paged caches.

k/v are [num_tokens, num_kv_heads, head_size] (any strides with a unit last
stride, fp32 or bf16, converted to the cache dtype); row t goes to
slot_mapping[t], and rows with a negative slot are skipped. stream is a
cudaStream_t as an integer for CUDA tensors (0: the default stream); CPU calls
ignore it. Raises ValueError for inconsistent shapes, dtypes, devices or slots.)doc");
    m.def("attention_head_size_supported", &lc::attn::supported_head_size, py::arg("head_size"),
          "Whether paged attention runs this head size (on every device it is built for).");
    m.def("paged_attention", &paged_attention, py::arg("plan"), py::arg("q"), py::arg("k_cache"),
          py::arg("v_cache"), py::arg("out"), py::arg("scale"), py::arg("sliding_window") = 0,
          py::arg("softcap") = 0.0f, py::arg("stream") = 0,
          R"doc(Causal attention of q over each sequence's cached K/V, written into out.

q/out: [num_tokens, num_heads, head_size] (fp32 or bf16, unit last stride);
caches: [num_blocks, num_kv_heads, block_size, head_size] (contiguous, fp32 or
bf16, head_size 32, 64, 80, 96, 128 or 256). Query head h reads KV head
h // (num_heads // num_kv_heads) (grouped-query attention). sliding_window > 0
limits a query at position p to positions > p - sliding_window; softcap > 0
maps logits to softcap * tanh(logits / softcap). Store the step's K/V first.
Raises ValueError for inconsistent shapes, dtypes, devices or block ids.)doc");
}

}  // namespace lcpy
