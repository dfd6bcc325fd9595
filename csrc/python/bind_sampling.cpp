// llmcore._C.sample and rng_uniform: a columnar face of lc_sample. Per-row
// parameters arrive as 1-D numpy arrays (or scalars, broadcast to every
// row), token lists as CSR (offsets, tokens) pairs; the outputs are fresh
// numpy arrays. The GIL is released while the kernel runs.
#include <cstring>
#include <string>
#include <vector>

#include "binding.h"
#include "sampling/sampling_kernels.h"

namespace lcpy {

namespace {

template <class T>
using Col = py::array_t<T, py::array::c_style | py::array::forcecast>;

// A per-row column: length num_rows, or a single value broadcast to all rows.
template <class T>
struct Column {
    Col<T> arr;
    const T* ptr = nullptr;
    bool scalar = false;
    Column(const py::handle& obj, const char* name, int64_t rows) {
        arr = Col<T>::ensure(obj);
        if (!arr) throw py::type_error(std::string(name) + " must be a numeric array or scalar");
        if (arr.ndim() > 1) throw py::value_error(std::string(name) + " must be 1-D");
        scalar = arr.size() == 1;
        if (!scalar && arr.size() != rows)
            throw py::value_error(std::string(name) + " has " + std::to_string(arr.size()) +
                                  " values for " + std::to_string(rows) + " rows");
        ptr = arr.data();
    }
    T operator[](int64_t r) const { return ptr[scalar ? 0 : r]; }
};

// A CSR token list for num_rows rows (ids may be longer than the last offset).
struct Csr {
    IntArray<int32_t> offsets, ids;
    Csr(const py::handle& obj, const char* name, int64_t rows, bool with_values,
        Col<float>* values) {
        if (obj.is_none()) return;
        py::tuple t = py::reinterpret_borrow<py::object>(obj).cast<py::tuple>();
        const size_t want = with_values ? 3 : 2;
        if (t.size() != want)
            throw py::value_error(std::string(name) + (with_values
                                                           ? " must be (offsets, tokens, values)"
                                                           : " must be (offsets, tokens)"));
        offsets = IntArray<int32_t>(t[0], name);
        ids = IntArray<int32_t>(t[1], name);
        if (offsets.size() != rows + 1)
            throw py::value_error(std::string(name) + " offsets must have num_rows + 1 = " +
                                  std::to_string(rows + 1) + " entries");
        const int32_t* o = offsets.data();
        if (o[0] < 0 || o[rows] < o[0] || o[rows] > ids.size())
            throw py::value_error(std::string(name) + " offsets do not fit the tokens array");
        if (with_values) {
            *values = Col<float>::ensure(t[2]);
            if (!*values || values->size() != ids.size())
                throw py::value_error(std::string(name) + " values must match its tokens");
        }
    }
    const int32_t* off() const { return offsets.size() ? offsets.data() : nullptr; }
    const int32_t* tok() const { return ids.data(); }
};

int32_t parse_mode(const std::string& mode) {
    if (mode == "raw") return LC_LOGPROBS_RAW;
    if (mode == "processed") return LC_LOGPROBS_PROCESSED;
    throw py::value_error("logprobs_mode must be 'raw' or 'processed', got '" + mode + "'");
}

py::tuple sample(const py::handle& logits, const py::handle& temperature, const py::handle& top_k,
                 const py::handle& top_p, const py::handle& min_p,
                 const py::handle& repetition_penalty, const py::handle& presence_penalty,
                 const py::handle& frequency_penalty, const py::handle& seed,
                 const py::handle& position, const py::handle& prompt_tokens,
                 const py::handle& output_tokens, const py::handle& logit_bias,
                 const py::handle& banned_tokens, const py::handle& allowed_bitmask,
                 const py::handle& use_bitmask, int num_top_logprobs,
                 const std::string& logprobs_mode, const py::handle& logprob_token_ids,
                 uintptr_t stream) {
    Borrowed t = borrow(logits, "logits");
    if (t.view()->ndim != 2) throw py::value_error("logits must be 2-D [num_rows, vocab]");
    const int64_t rows = t.view()->shape[0];
    const int64_t vocab = t.view()->shape[1];

    Column<float> temp(temperature, "temperature", rows), tp(top_p, "top_p", rows),
        mp(min_p, "min_p", rows), rp(repetition_penalty, "repetition_penalty", rows),
        pp(presence_penalty, "presence_penalty", rows),
        fp(frequency_penalty, "frequency_penalty", rows);
    Column<int32_t> tk(top_k, "top_k", rows);
    Column<uint64_t> sd(seed, "seed", rows);
    Column<int64_t> pos(position, "position", rows);

    Col<float> bias_values;
    Csr prompt(prompt_tokens, "prompt_tokens", rows, false, nullptr);
    Csr output(output_tokens, "output_tokens", rows, false, nullptr);
    Csr bias(logit_bias, "logit_bias", rows, true, &bias_values);
    Csr banned(banned_tokens, "banned_tokens", rows, false, nullptr);
    Csr listed(logprob_token_ids, "logprob_token_ids", rows, false, nullptr);

    Col<int32_t> mask;
    std::vector<int32_t> use(size_t(rows), 0);
    int32_t words = 0;
    if (!allowed_bitmask.is_none()) {
        mask = Col<int32_t>::ensure(allowed_bitmask);
        if (!mask || mask.ndim() != 2 || mask.shape(0) != rows)
            throw py::value_error("allowed_bitmask must be an int32 array [num_rows, words]");
        words = int32_t(mask.shape(1));
        if (use_bitmask.is_none()) {
            std::fill(use.begin(), use.end(), 1);
        } else {
            Column<int32_t> u(use_bitmask, "use_bitmask", rows);
            for (int64_t r = 0; r < rows; ++r) use[size_t(r)] = u[r] != 0;
        }
    } else if (!use_bitmask.is_none()) {
        Column<int32_t> u(use_bitmask, "use_bitmask", rows);
        for (int64_t r = 0; r < rows; ++r)
            if (u[r]) throw py::value_error("use_bitmask is set but allowed_bitmask is None");
    }

    std::vector<lc_sampling_row> params(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
        lc_sampling_row& p = params[size_t(r)];
        p.temperature = temp[r];
        p.top_k = tk[r];
        p.top_p = tp[r];
        p.min_p = mp[r];
        p.repetition_penalty = rp[r];
        p.presence_penalty = pp[r];
        p.frequency_penalty = fp[r];
        p.use_bitmask = use[size_t(r)];
        p.seed = sd[r];
        p.position = pos[r];
    }
    if (num_top_logprobs < 0)
        throw py::value_error("num_top_logprobs must be >= 0");  // the core checks <= vocab

    lc_sampling_batch b{};
    b.num_rows = int32_t(rows);
    b.rows = params.data();
    b.prompt_offsets = prompt.off();
    b.prompt_tokens = prompt.tok();
    b.output_offsets = output.off();
    b.output_tokens = output.tok();
    b.bias_offsets = bias.off();
    b.bias_tokens = bias.tok();
    b.bias_values = bias.off() ? bias_values.data() : nullptr;
    b.banned_offsets = banned.off();
    b.banned_tokens = banned.tok();
    b.allowed_bitmask = mask ? mask.data() : nullptr;
    b.bitmask_words = words;
    b.num_top_logprobs = num_top_logprobs;
    b.logprobs_mode = parse_mode(logprobs_mode);
    b.logprob_offsets = listed.off();
    b.logprob_ids = listed.tok();

    py::array_t<int32_t> tokens(rows), ranks(rows);
    py::array_t<float> logprobs(rows);
    py::array_t<int32_t> top_tokens({rows, int64_t(num_top_logprobs)});
    py::array_t<float> top_logprobs({rows, int64_t(num_top_logprobs)});
    const int64_t num_listed = listed.off() ? listed.off()[rows] - listed.off()[0] : 0;
    py::array_t<float> listed_logprobs(num_listed);
    lc_sample_output out{tokens.mutable_data(), logprobs.mutable_data(), ranks.mutable_data(),
                         num_top_logprobs ? top_tokens.mutable_data() : nullptr,
                         num_top_logprobs ? top_logprobs.mutable_data() : nullptr,
                         num_listed ? listed_logprobs.mutable_data() : nullptr};
    (void)vocab;
    lc_status st;
    {
        py::gil_scoped_release release;
        st = lc_sample(t.view(), &b, reinterpret_cast<void*>(stream), &out);
    }
    check(st);
    return py::make_tuple(tokens, logprobs, ranks, top_tokens, top_logprobs, listed_logprobs);
}

py::array_t<float> rng_uniform(uint64_t seed, int64_t position, const py::handle& index) {
    Col<int64_t> idx = Col<int64_t>::ensure(index);
    if (!idx) throw py::type_error("index must be an integer array or scalar");
    py::array_t<float> out(idx.size());
    const int64_t* in = idx.data();
    float* o = out.mutable_data();
    for (int64_t i = 0; i < idx.size(); ++i) {
        if (in[i] < 0 || in[i] > int64_t(UINT32_MAX))
            throw py::value_error("index must be in [0, 2^32)");
        o[i] = lc_rng_uniform(seed, position, uint32_t(in[i]));
    }
    return out;
}

}  // namespace

void bind_sampling(py::module_& m) {
    m.attr("NO_TOKEN") = LC_NO_TOKEN;
    m.def("sample", &sample, py::arg("logits"), py::arg("temperature"), py::arg("top_k"),
          py::arg("top_p"), py::arg("min_p"), py::arg("repetition_penalty"),
          py::arg("presence_penalty"), py::arg("frequency_penalty"), py::arg("seed"),
          py::arg("position"), py::kw_only(), py::arg("prompt_tokens") = py::none(),
          py::arg("output_tokens") = py::none(), py::arg("logit_bias") = py::none(),
          py::arg("banned_tokens") = py::none(), py::arg("allowed_bitmask") = py::none(),
          py::arg("use_bitmask") = py::none(), py::arg("num_top_logprobs") = 0,
          py::arg("logprobs_mode") = "raw", py::arg("logprob_token_ids") = py::none(),
          py::arg("stream") = 0,
          "Samples one token per row of logits [num_rows, vocab] (fp32/bf16, borrowed via "
          "__dlpack__). Returns (tokens int32 [B], logprobs float32 [B], ranks int32 [B], "
          "top_tokens int32 [B, N], top_logprobs float32 [B, N], listed_logprobs float32 "
          "[L]: the logprob of each id of logprob_token_ids' (offsets, ids) lists, in order).");
    m.def(
        "sampling_isa",
        [] { return std::string(lc::isa_name(lc::sampling::current_isa())); },
        "The instruction set of the sampler's dense loops: avx512, avx2 or scalar.");
    m.def(
        "set_sampling_isa",
        [](const std::string& name) {
            return std::string(lc::isa_name(lc::sampling::set_isa(isa_arg(name))));
        },
        py::arg("isa"), "Caps the sampler's instruction set (tests); returns the one in effect.");
    m.def("rng_uniform", &rng_uniform, py::arg("seed"), py::arg("position"), py::arg("index"),
          "The sampler's uniforms in [0, 1) for (seed, position, index) (float32 array, "
          "one per index).");
}

}  // namespace lcpy
