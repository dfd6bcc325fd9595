// The llmcore._C module: DLPack borrowing, error mapping, and the bindings.
#include <cstring>
#include <string>

#include "binding.h"

namespace {

// The DLPack ABI (dlpack.h v0.8 and v1.x), declared here so that no header
// from another project is needed.
struct DLDevice {
    int32_t device_type;  // 1 = CPU, 2 = CUDA, 3 = CUDA host
    int32_t device_id;
};
struct DLDataType {
    uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat
    uint8_t bits;
    uint16_t lanes;
};
struct DLTensor {
    void* data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t* shape;
    int64_t* strides;  // in elements; NULL = compact row-major
    uint64_t byte_offset;
};
struct DLManagedTensor {
    DLTensor dl_tensor;
    void* manager_ctx;
    void (*deleter)(DLManagedTensor*);
};
struct DLPackVersion {
    uint32_t major, minor;
};
struct DLManagedTensorVersioned {
    DLPackVersion version;
    void* manager_ctx;
    void (*deleter)(DLManagedTensorVersioned*);
    uint64_t flags;
    DLTensor dl_tensor;
};

py::object g_out_of_blocks;

}  // namespace

namespace lcpy {

lc::Isa isa_arg(const std::string& name) {
    lc::Isa isa;
    if (!lc::parse_isa(name.c_str(), &isa))
        throw py::value_error("unknown instruction set '" + name + "': scalar, avx2 or avx512");
    return isa;
}

void check(lc_status status) {
    if (status == LC_OK) return;
    std::string msg = lc_last_error();
    switch (status) {
        case LC_ERR_INVALID_ARGUMENT: throw py::value_error(msg);
        case LC_ERR_OUT_OF_BLOCKS:
            PyErr_SetString(g_out_of_blocks.ptr(), msg.c_str());
            throw py::error_already_set();
        case LC_ERR_UNSUPPORTED: PyErr_SetString(PyExc_NotImplementedError, msg.c_str()); throw py::error_already_set();
        case LC_ERR_OUT_OF_MEMORY: PyErr_SetString(PyExc_MemoryError, msg.c_str()); throw py::error_already_set();
        default: throw std::runtime_error(msg);
    }
}

Borrowed::Borrowed(const py::handle& obj, const char* name) {
    if (!py::hasattr(obj, "__dlpack__"))
        throw py::type_error(std::string(name) + " must support __dlpack__ (a torch tensor or numpy array)");
    py::object cap;
    // Ask for a versioned capsule when the producer supports it; fall back.
    try {
        cap = obj.attr("__dlpack__")(py::arg("max_version") = py::make_tuple(1, 0));
    } catch (py::error_already_set&) {
        cap = obj.attr("__dlpack__")();
    }
    adopt(cap, name);
}

Borrowed Borrowed::from_capsule(const py::object& capsule, const char* name) {
    Borrowed b;
    b.adopt(capsule, name);
    return b;
}

void Borrowed::adopt(const py::object& cap, const char* name) {
    PyObject* c = cap.ptr();
    DLTensor* dl = nullptr;
    if (PyCapsule_IsValid(c, "dltensor_versioned")) {
        auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(c, "dltensor_versioned"));
        PyCapsule_SetName(c, "used_dltensor_versioned");
        managed_ = m;
        versioned_ = 1;
        dl = &m->dl_tensor;
    } else if (PyCapsule_IsValid(c, "dltensor")) {
        auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
        PyCapsule_SetName(c, "used_dltensor");
        managed_ = m;
        dl = &m->dl_tensor;
    } else {
        throw py::type_error(std::string(name) + ": __dlpack__ did not return a DLPack capsule");
    }
    if (dl->ndim < 1 || dl->ndim > LC_MAX_DIMS)
        throw py::value_error(std::string(name) + " must have 1 to 4 dims");
    if (dl->dtype.lanes != 1) throw py::value_error(std::string(name) + ": vector dtypes unsupported");
    if (dl->dtype.code == 2 && dl->dtype.bits == 32) t_.dtype = LC_DTYPE_F32;
    else if (dl->dtype.code == 4 && dl->dtype.bits == 16) t_.dtype = LC_DTYPE_BF16;
    else if (dl->dtype.code == 2 && dl->dtype.bits == 16) t_.dtype = LC_DTYPE_F16;
    else throw py::value_error(std::string(name) + " must be float32, bfloat16 or float16");
    if (dl->device.device_type == 1 || dl->device.device_type == 3) t_.device = LC_DEVICE_CPU;
    else if (dl->device.device_type == 2) t_.device = LC_DEVICE_CUDA;
    else throw py::value_error(std::string(name) + " lives on an unsupported device");
    t_.device_id = dl->device.device_id;
    t_.ndim = dl->ndim;
    t_.data = static_cast<char*>(dl->data) + dl->byte_offset;
    int64_t expect = 1;
    for (int i = dl->ndim - 1; i >= 0; --i) {
        t_.shape[i] = dl->shape[i];
        t_.strides[i] = dl->strides ? dl->strides[i] : expect;
        expect *= dl->shape[i];
    }
}

Borrowed::Borrowed(Borrowed&& o) noexcept : managed_(o.managed_), versioned_(o.versioned_), t_(o.t_) {
    o.managed_ = nullptr;
}

Borrowed& Borrowed::operator=(Borrowed&& o) noexcept {
    std::swap(managed_, o.managed_);
    std::swap(versioned_, o.versioned_);
    std::swap(t_, o.t_);
    return *this;
}

Borrowed::~Borrowed() {
    if (!managed_) return;
    if (versioned_) {
        auto* m = static_cast<DLManagedTensorVersioned*>(managed_);
        if (m->deleter) m->deleter(m);
    } else {
        auto* m = static_cast<DLManagedTensor*>(managed_);
        if (m->deleter) m->deleter(m);
    }
}

// A borrowed view of obj. For torch tensors this skips Tensor.__dlpack__, a
// Python-level method (~11 us), for torch's C exporter (~1 us): a model calls
// the core's kernels with several tensors in every layer of every step.
Borrowed borrow(const py::handle& obj, const char* name) {
    // Looked up once, when the first torch tensor arrives (torch is then
    // imported), and leaked on purpose: Python objects must not be released
    // after the interpreter has finalized.
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

template <class T>
IntArray<T>::IntArray(const py::handle& obj, const char* name) {
    if (obj.is_none()) return;
    try {
        arr_ = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(obj);
    } catch (py::error_already_set&) {
        arr_ = {};
    }
    if (!arr_) throw py::type_error(std::string(name) + " must be an integer array");
    ptr_ = arr_.data();
    size_ = arr_.size();
}

template class IntArray<int32_t>;
template class IntArray<int64_t>;

void bind_runtime(py::module_& m) {
    m.def("version", &lc_version);
    m.def("build_features", &lc_build_features);
    m.def("cpu_isa", &lc_cpu_isa);
    m.def("abi_version", &lc_abi_version);
    m.def("set_num_threads", [](int n) { check(lc_set_num_threads(n)); }, py::arg("n"));
    m.def("get_num_threads", &lc_get_num_threads);
}

}  // namespace lcpy

PYBIND11_MODULE(_C, m) {
    m.doc() = "llmcore: paged KV block pool, paged attention and sampling";
    g_out_of_blocks = py::reinterpret_borrow<py::object>(
        PyErr_NewException("llmcore._C.OutOfBlocksError", PyExc_RuntimeError, nullptr));
    m.attr("OutOfBlocksError") = g_out_of_blocks;
    lcpy::bind_runtime(m);
    lcpy::bind_block_pool(m);
    lcpy::bind_attention(m);
    lcpy::bind_sampling(m);
    lcpy::bind_linear(m);
    lcpy::bind_elementwise(m);
    lcpy::bind_moe(m);
}
