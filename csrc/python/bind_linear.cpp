// Python face of lc_linear: out = x @ weight^T (+ bias), written into a
// caller-allocated out (python/llmcore/linear.py allocates it for torch
// callers). Arguments are converted while the GIL is held; the kernel runs
// with it released.
#include <cstring>
#include <string>

#include "binding.h"
#include "linear.h"

namespace lcpy {

namespace {


py::object linear(const py::handle& x, const py::handle& weight, const py::handle& bias,
                  const py::object& out) {
    if (out.is_none())
        throw py::value_error("out is required (llmcore.linear allocates it for torch tensors)");
    Borrowed bx = borrow(x, "x"), bw = borrow(weight, "weight"), bo = borrow(out, "out");
    Borrowed bb;
    if (!bias.is_none()) bb = borrow(bias, "bias");
    const lc_tensor* bias_view = bias.is_none() ? nullptr : bb.view();
    lc_status st;
    {
        py::gil_scoped_release nogil;
        st = lc_linear(bx.view(), bw.view(), bias_view, bo.view(), nullptr);
    }
    check(st);
    return out;
}

}  // namespace

void bind_linear(py::module_& m) {
    m.def("linear", &linear, py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(),
          py::arg("out") = py::none(),
          R"doc(out = x @ weight^T (+ bias), computed in fp32, written into out and returned.

x: [M, K] float32 (unit last stride); weight: [N, K] bfloat16 or float32,
contiguous (bf16 is widened in registers: half the bytes read of fp32);
bias: [N] float32/bfloat16 or None; out: [M, N] float32 or bfloat16 (unit last
stride, not overlapping the inputs), required here. CPU tensors only (CUDA:
NotImplementedError). Raises ValueError for inconsistent shapes or dtypes.)doc");
    m.def(
        "linear_isa",
        [] { return std::string(lc::linear::isa_name(lc::linear::current_isa())); },
        "The instruction set the CPU linear kernel runs with: avx2 or scalar.");
}

}  // namespace lcpy
