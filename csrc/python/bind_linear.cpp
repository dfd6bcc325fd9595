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

// A borrowed view of obj. For torch tensors this skips Tensor.__dlpack__, a
// Python-level method (~11 us), for torch's C exporter (~1 us): a model calls
// linear several times per layer per step.
Borrowed borrow(const py::handle& obj, const char* name) {
    // Looked up once, when the first torch tensor arrives, and leaked on
    // purpose: Python objects must not be released after finalization.
    static PyObject* tensor_type = nullptr;
    static PyObject* to_dlpack = nullptr;
    static bool looked_up = false;
    if (!looked_up && std::strcmp(Py_TYPE(obj.ptr())->tp_name, "Tensor") == 0) {
        looked_up = true;
        try {
            py::module_ torch = py::module_::import("torch");
            to_dlpack = py::object(torch.attr("_C").attr("_to_dlpack")).release().ptr();
            tensor_type = py::object(torch.attr("Tensor")).release().ptr();
        } catch (py::error_already_set&) {
            // A torch without the C exporter: Tensor.__dlpack__ still works.
        }
    }
    if (tensor_type && PyObject_TypeCheck(obj.ptr(), reinterpret_cast<PyTypeObject*>(tensor_type)))
        return Borrowed::from_capsule(py::reinterpret_borrow<py::object>(to_dlpack)(obj), name);
    return Borrowed(obj, name);
}

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
