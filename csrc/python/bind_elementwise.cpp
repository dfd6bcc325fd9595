// Python face of lc_rms_norm, lc_silu_mul and lc_rope: tensors borrowed
// through DLPack, the GIL released while the kernels run.
#include <string>

#include "binding.h"
#include "elementwise/elementwise.h"

namespace lcpy {

namespace {

py::object rms_norm(const py::handle& x, const py::handle& weight, double eps,
                    const py::object& out, const py::handle& residual) {
    Borrowed bx = borrow(x, "x"), bw = borrow(weight, "weight"), bo = borrow(out, "out");
    Borrowed br = borrow_optional(residual, "residual");
    call_nogil([&] {
        return lc_rms_norm(bx.view(), br.view_or_null(), bw.view(), float(eps), bo.view());
    });
    return out;
}

py::object silu_mul(const py::handle& x, const py::object& out) {
    Borrowed bx = borrow(x, "x"), bo = borrow(out, "out");
    call_nogil([&] { return lc_silu_mul(bx.view(), bo.view()); });
    return out;
}

void rope(const py::handle& q, const py::handle& k, const py::handle& cos, const py::handle& sin) {
    Borrowed bq = borrow(q, "q"), bc = borrow(cos, "cos"), bs = borrow(sin, "sin");
    Borrowed bk = borrow_optional(k, "k");
    call_nogil([&] { return lc_rope(bq.view(), bk.view_or_null(), bc.view(), bs.view()); });
}

}  // namespace

void bind_elementwise(py::module_& m) {
    m.def("rms_norm", &rms_norm, py::arg("x"), py::arg("weight"), py::arg("eps"), py::arg("out"),
          py::arg("residual") = py::none(),
          R"doc(out = x / sqrt(mean(x^2, -1) + eps) * weight, row by row; returns out.

x, out: [T, H] float32 (out may be x); weight: [H] float32 or bfloat16.
With residual ([T, H] float32): residual += x first (in place), and the sum is
normalised: the "add, then norm" of a pre-norm decoder layer.)doc");
    m.def("silu_mul", &silu_mul, py::arg("x"), py::arg("out"),
          "out[t, i] = silu(x[t, i]) * x[t, I + i] for x [T, 2I] float32, out [T, I]; returns out.");
    m.def("rope", &rope, py::arg("q"), py::arg("k"), py::arg("cos"), py::arg("sin"),
          R"doc(Rotary embedding in place (rotate-half layout).

q: [T, Hq, D], k: [T, Hk, D] float32 or None (any strides, unit last stride);
cos, sin: [T, D/2] float32, the angles of each token's position.)doc");
    m.def(
        "set_elementwise_isa",
        [](const std::string& name) {
            return std::string(lc::isa_name(lc::elementwise::set_isa(isa_arg(name))));
        },
        py::arg("isa"), "Caps the elementwise kernels' instruction set (tests); returns the one in effect.");
    m.def(
        "elementwise_isa",
        [] { return std::string(lc::isa_name(lc::elementwise::current_isa())); },
        "The instruction set the elementwise kernels run with: avx2 or scalar.");
}

}  // namespace lcpy
