// Python face of lc_linear: out = x @ weight^T (+ bias), written into a
// caller-allocated out (python/llmcore/linear.py allocates it for torch
// callers). Arguments are converted while the GIL is held; the kernel runs
// with it released.
#include <cstring>
#include <string>

#include "binding.h"
#include "linear/linear.h"
#include "packed_weight.h"
#include "weight/weight_quant.h"

namespace lcpy {

namespace {

py::object linear(const py::handle& x, const py::handle& weight, const py::handle& bias,
                  const py::object& out, const std::string& kernel) {
    int32_t k = LC_LINEAR_KERNEL_AUTO;
    if (kernel == "dot")
        k = LC_LINEAR_KERNEL_DOT;
    else if (kernel == "tiles")
        k = LC_LINEAR_KERNEL_TILES;
    else if (kernel != "auto")
        throw py::value_error("kernel must be 'auto', 'dot' or 'tiles', not '" + kernel + "'");
    if (out.is_none())
        throw py::value_error("out is required (llmcore.linear allocates it for torch tensors)");
    Borrowed bx = borrow(x, "x"), bo = borrow(out, "out");
    Borrowed bb = borrow_optional(bias, "bias");
    if (py::isinstance<PackedWeight>(weight)) {
        const lc_weight* pw = weight.cast<const PackedWeight&>().get();
        call_nogil([&] {
            return lc_linear_packed_kernel(bx.view(), pw, bb.view_or_null(), bo.view(), k, nullptr);
        });
        return out;
    }
    Borrowed bw = borrow(weight, "weight");
    call_nogil([&] {
        return lc_linear(bx.view(), bw.view(), bb.view_or_null(), bo.view(), nullptr);
    });
    return out;
}

}  // namespace

void bind_linear(py::module_& m) {
    py::class_<PackedWeight>(m, "PackedWeight", R"doc(A weight matrix [N, K] copied into the core's linear layout.

PackedWeight(weight): weight [N, K] float32 or bfloat16 (torch or numpy, CPU),
copied once; pass the object as llmcore.linear's weight. The source may be
freed afterwards. Read only, so one object serves many threads.)doc")
        .def(py::init<const py::handle&>(), py::arg("weight"))
        .def_static(
            "from_gguf",
            [](int32_t type, const py::object& blocks, int64_t n, int64_t k) {
                return std::make_unique<PackedWeight>(type, blocks, n, k);
            },
            py::arg("type"), py::arg("blocks"), py::arg("n"), py::arg("k"),
            R"doc(A GGUF matrix [n, k] kept in its block format: type is ggml's number
(gguf_kept_types(): 2 = Q4_0, 3 = Q4_1, 6 = Q5_0, 7 = Q5_1, 8 = Q8_0, 12 = Q4_K,
13 = Q5_K, 14 = Q6_K), blocks a C-contiguous buffer of the n rows' blocks as the file
stores them (copied; k a multiple of 32, of 256 for the K-quants). llmcore.linear then
rounds x per 32-block to int16 (or int8) and multiplies with exact integer block dots;
rows() dequantizes exactly as gguf-py does.)doc")
        .def_property_readonly("quant_type", &PackedWeight::quant_type,
                               "ggml type number of a quantized weight, 0 for a float one")
        .def_property_readonly("shape", [](const PackedWeight& w) { return py::make_tuple(w.n(), w.k()); })
        .def_property_readonly("dtype", &PackedWeight::dtype, "'bfloat16', 'float32', or a GGUF type's name (gguf_kept_types())")
        .def_property_readonly("nbytes", &PackedWeight::nbytes, "bytes of memory held")
        .def("rows", &PackedWeight::rows, py::arg("ids"), py::arg("out"),
             "out[i] = W[ids[i]] (out [len(ids), K] float32 or bfloat16); returns out.")
        .def("__repr__", [](const PackedWeight& w) {
            return "PackedWeight(shape=(" + std::to_string(w.n()) + ", " + std::to_string(w.k()) +
                   "), dtype=" + w.dtype() + ")";
        });
    m.def(
        "gguf_kept_types",
        [] {
            py::dict d;
            for (const lc::quant::Format& f : lc::quant::kFormats) d[py::int_(f.type)] = f.name;
            return d;
        },
        "ggml type number -> name ('q4_k', ...) of the GGUF types PackedWeight.from_gguf keeps.");
    m.def("linear", &linear, py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(),
          py::arg("out") = py::none(), py::arg("kernel") = "auto",
          R"doc(out = x @ weight^T (+ bias), computed in fp32, written into out and returned.

x: [M, K] float32 (unit last stride); weight: a PackedWeight, or [N, K]
bfloat16 or float32, contiguous (bf16 is widened in registers: half the bytes read of fp32);
bias: [N] float32/bfloat16 or None; out: [M, N] float32 or bfloat16 (unit last
stride, not overlapping the inputs), required here. kernel ('auto', 'dot' or
'tiles'; packed weights): the kernel family for a packed bf16 weight where the
CPU has two (lc_linear_kernel: 'dot' for decode rows, 'tiles' for prompt rows).
CPU tensors only (CUDA: NotImplementedError). Raises ValueError for inconsistent
shapes or dtypes.)doc");
    m.def(
        "set_linear_isa",
        [](const std::string& name) {
            return std::string(lc::linear::isa_name(lc::linear::set_isa(isa_arg(name))));
        },
        py::arg("isa"), "Caps the linear kernels' instruction set (tests); returns the one in effect.");
    m.def(
        "set_quant_activation_bits",
        [](int bits) {
            check(lc_set_quant_activation_bits(bits));
            return lc_get_quant_activation_bits();
        },
        py::arg("bits"),
        "Quantized linears round activations to this many bits per block of 32: 16 (the "
        "default) or 8 (llama.cpp's q8); process-wide. Returns the width in effect.");
    m.def("quant_activation_bits", [] { return lc_get_quant_activation_bits(); },
          "The activation width quantized linears use: 16 or 8.");
    m.def(
        "linear_isa",
        [] { return std::string(lc::linear::isa_name(lc::linear::current_isa())); },
        "The instruction set the CPU linear kernel runs with: avx2 or scalar.");
}

}  // namespace lcpy
