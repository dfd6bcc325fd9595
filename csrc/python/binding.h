// Shared pieces of the pybind11 module: DLPack import (borrowed, zero copy),
// buffer-protocol int arrays, and status -> Python exception mapping.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "llmcore/llmcore.h"
#include "runtime/cpu_isa.h"

namespace py = pybind11;

namespace lcpy {

// Raises the Python exception that matches a failed status (ValueError,
// llmcore.OutOfBlocksError, NotImplementedError, MemoryError, RuntimeError).
void check(lc_status status);

// A tensor borrowed from any object with __dlpack__ (torch, numpy) for the
// duration of one call: holds the DLPack capsule and releases it on
// destruction. view() is the lc_tensor the core reads.
class Borrowed {
   public:
    Borrowed() = default;
    explicit Borrowed(const py::handle& obj, const char* name);
    // Adopts a DLPack capsule the caller already exported (e.g. with
    // torch._C._to_dlpack, much cheaper than Tensor.__dlpack__).
    static Borrowed from_capsule(const py::object& capsule, const char* name);
    Borrowed(Borrowed&&) noexcept;
    Borrowed& operator=(Borrowed&&) noexcept;
    Borrowed(const Borrowed&) = delete;
    Borrowed& operator=(const Borrowed&) = delete;
    ~Borrowed();
    const lc_tensor* view() const { return &t_; }
    // view(), or nullptr for an optional argument that was None (never borrowed).
    const lc_tensor* view_or_null() const { return managed_ ? &t_ : nullptr; }
    lc_tensor& tensor() { return t_; }

   private:
    void adopt(const py::object& capsule, const char* name);

    void* managed_ = nullptr;  // DLManagedTensor*
    int versioned_ = 0;
    lc_tensor t_{};
};

// obj borrowed through torch's C DLPack exporter when obj is a torch tensor (about 1 us
// instead of 11 us for Tensor.__dlpack__), through __dlpack__ otherwise.
Borrowed borrow(const py::handle& obj, const char* name);

// An optional tensor argument: empty (view_or_null() == nullptr) when obj is None.
inline Borrowed borrow_optional(const py::handle& obj, const char* name) {
    return obj.is_none() ? Borrowed() : borrow(obj, name);
}

// An instruction-set name from Python ("scalar", "avx2", "avx512"); ValueError otherwise.
lc::Isa isa_arg(const std::string& name);

// Runs a core call with the GIL released, then raises its failure as a Python exception.
template <class F>
void call_nogil(F&& call) {
    lc_status st;
    {
        py::gil_scoped_release nogil;
        st = call();
    }
    check(st);
}

// A read-only int32/int64 array from the buffer protocol (numpy array,
// array.array, bytes-like). Copies only when the dtype or layout differ.
template <class T>
class IntArray {
   public:
    IntArray() = default;
    IntArray(const py::handle& obj, const char* name);
    const T* data() const { return size_ ? ptr_ : nullptr; }
    int64_t size() const { return size_; }

   private:
    py::array_t<T, py::array::c_style | py::array::forcecast> arr_;
    const T* ptr_ = nullptr;
    int64_t size_ = 0;
};

extern template class IntArray<int32_t>;
extern template class IntArray<int64_t>;

void bind_runtime(py::module_& m);
void bind_block_pool(py::module_& m);
void bind_attention(py::module_& m);
void bind_sampling(py::module_& m);
void bind_linear(py::module_& m);
void bind_elementwise(py::module_& m);
void bind_moe(py::module_& m);

}  // namespace lcpy
