// Python face of lc_moe_experts: PackedExperts (the E experts' packed matrices
// as one object, checked once, so that a layer passes one argument instead of
// two lists of E) and moe_experts, which takes that object or the two lists.
// Tensors are borrowed through DLPack, the ids through the array protocol
// (int32 or int64, no copy when C-contiguous); the kernel runs without the GIL.
#include <string>
#include <vector>

#include "binding.h"
#include "packed_weight.h"

namespace lcpy {

namespace {

std::string dims(int64_t a, int64_t b) {
    return "[" + std::to_string(a) + ", " + std::to_string(b) + "]";
}

// The experts' matrices, kept alive by holding their Python objects.
class PackedExperts {
   public:
    PackedExperts(const py::sequence& gate_up, const py::sequence& down) {
        const size_t n = py::len(gate_up);
        if (n == 0 || n != py::len(down))
            throw py::value_error("gate_up and down must list the same number (>= 1) of experts, got " +
                                  std::to_string(n) + " and " + std::to_string(py::len(down)));
        for (size_t e = 0; e < n; ++e) {
            const PackedWeight& g = weight_at(gate_up, e, "gate_up");
            const PackedWeight& d = weight_at(down, e, "down");
            if (e == 0) {
                hidden_ = g.k();
                inter_ = g.n() / 2;
                if (g.n() % 2) throw py::value_error("gate_up[0] must be [2 * I, H], got " + dims(g.n(), g.k()));
            }
            if (g.n() != 2 * inter_ || g.k() != hidden_)
                throw py::value_error("gate_up[" + std::to_string(e) + "] is " + dims(g.n(), g.k()) +
                                      ", expected " + dims(2 * inter_, hidden_));
            if (d.n() != hidden_ || d.k() != inter_)
                throw py::value_error("down[" + std::to_string(e) + "] is " + dims(d.n(), d.k()) +
                                      ", expected " + dims(hidden_, inter_));
            gate_up_.push_back(g.get());
            down_.push_back(d.get());
            nbytes_ += g.nbytes() + d.nbytes();
        }
        owners_ = py::make_tuple(py::tuple(gate_up), py::tuple(down));
    }

    int32_t size() const { return int32_t(gate_up_.size()); }
    int64_t hidden() const { return hidden_; }
    int64_t intermediate() const { return inter_; }
    int64_t nbytes() const { return nbytes_; }
    const lc_weight* const* gate_up() const { return gate_up_.data(); }
    const lc_weight* const* down() const { return down_.data(); }

   private:
    static const PackedWeight& weight_at(const py::sequence& s, size_t e, const char* what) {
        const py::object o = s[e];
        if (!py::isinstance<PackedWeight>(o))
            throw py::type_error(std::string(what) + "[" + std::to_string(e) +
                                 "] must be a PackedWeight, got " +
                                 std::string(py::str(py::type::of(o).attr("__name__"))));
        return o.cast<const PackedWeight&>();
    }

    std::vector<const lc_weight*> gate_up_, down_;
    py::tuple owners_;
    int64_t hidden_ = 0, inter_ = 0, nbytes_ = 0;
};

[[noreturn]] void not_on_cpu(const char* what) {
    PyErr_SetString(PyExc_NotImplementedError,
                    (std::string("moe_experts runs on the CPU only: ") + what +
                     " is a CUDA tensor")
                        .c_str());
    throw py::error_already_set();
}

// topk_ids as a C-contiguous int32 or int64 array of topk_weights' shape [T, k].
py::array ids_arg(const py::handle& obj, const lc_tensor& weights) {
    if (py::hasattr(obj, "is_cuda") && obj.attr("is_cuda").cast<bool>()) not_on_cpu("topk_ids");
    py::array a = py::array::ensure(obj);
    if (!a) throw py::type_error("topk_ids must be an int32 or int64 array [T, k] (torch or numpy)");
    const py::dtype dt = a.dtype();
    if (dt.kind() != 'i' || (dt.itemsize() != 4 && dt.itemsize() != 8))
        throw py::type_error("topk_ids must be int32 or int64, got " + std::string(py::str(dt)));
    if (a.ndim() != 2 || a.shape(0) != weights.shape[0] || a.shape(1) != weights.shape[1])
        throw py::value_error("topk_ids must have topk_weights' shape " +
                              dims(weights.shape[0], weights.shape[1]));
    constexpr int kC = py::array::c_style | py::array::forcecast;
    if (dt.itemsize() == 4) return py::array_t<int32_t, kC>::ensure(a);
    return py::array_t<int64_t, kC>::ensure(a);
}

py::object moe_experts(const py::handle& x, const py::handle& topk_ids,
                       const py::handle& topk_weights, const PackedExperts& experts,
                       const py::object& out) {
    Borrowed bx = borrow(x, "x"), bw = borrow(topk_weights, "topk_weights"), bo = borrow(out, "out");
    const py::array ids = ids_arg(topk_ids, *bw.view());
    const void* id_data = ids.data();
    const int32_t id_bytes = int32_t(ids.itemsize());
    call_nogil([&] {
        return lc_moe_experts(bx.view(), id_data, id_bytes, bw.view(), experts.gate_up(),
                              experts.down(), experts.size(), bo.view());
    });
    return out;
}

}  // namespace

void bind_moe(py::module_& m) {
    py::class_<PackedExperts>(m, "PackedExperts", R"doc(The E experts of an MoE layer, as moe_experts takes them.

PackedExperts(gate_up, down): gate_up a sequence of E PackedWeight [2I, H] (the
gate rows, then the up rows), down E PackedWeight [H, I]; every expert the same
shapes (ValueError otherwise), formats free (float or quantized, mixed). The
weights are shared, not copied, and kept alive by this object.)doc")
        .def(py::init<const py::sequence&, const py::sequence&>(), py::arg("gate_up"),
             py::arg("down"))
        .def("__len__", &PackedExperts::size)
        .def_property_readonly("num_experts", &PackedExperts::size)
        .def_property_readonly("hidden_size", &PackedExperts::hidden, "H")
        .def_property_readonly("intermediate_size", &PackedExperts::intermediate, "I")
        .def_property_readonly("nbytes", &PackedExperts::nbytes, "bytes of the packed matrices")
        .def("__repr__", [](const PackedExperts& p) {
            return "PackedExperts(num_experts=" + std::to_string(p.size()) +
                   ", hidden_size=" + std::to_string(p.hidden()) +
                   ", intermediate_size=" + std::to_string(p.intermediate()) + ")";
        });
    const char* doc = R"doc(out[t] = sum_j topk_weights[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])),
e = topk_ids[t, j]; written into out and returned.

x: [T, H] float32; topk_ids: [T, k] int32 or int64 (torch or numpy), each in [0, E);
topk_weights: [T, k] float32; experts: a PackedExperts, or gate_up and down as two
sequences of E PackedWeight; out: [T, H] float32, x itself or apart from the inputs.
The routed rows are grouped by expert, one multi-row product per used expert; a
token's result has the same bits whatever else is in the batch. CPU only (CUDA:
NotImplementedError). ValueError for bad shapes, dtypes or ids.)doc";
    m.def("moe_experts", &moe_experts, py::arg("x"), py::arg("topk_ids"), py::arg("topk_weights"),
          py::arg("experts"), py::arg("out"), doc);
    m.def(
        "moe_experts",
        [](const py::handle& x, const py::handle& topk_ids, const py::handle& topk_weights,
           const py::sequence& gate_up, const py::sequence& down, const py::object& out) {
            return moe_experts(x, topk_ids, topk_weights, PackedExperts(gate_up, down), out);
        },
        py::arg("x"), py::arg("topk_ids"), py::arg("topk_weights"), py::arg("gate_up"),
        py::arg("down"), py::arg("out"));
}

}  // namespace lcpy
