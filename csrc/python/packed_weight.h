// PackedWeight, the Python object that owns an lc_weight: shared by the
// bindings that take packed matrices (linear, moe_experts).
#pragma once

#include <string>

#include "binding.h"
#include "weight/weight_quant.h"

namespace lcpy {

// A matrix packed by the core (lc_weight), owned by this object.
class PackedWeight {
   public:
    explicit PackedWeight(const py::handle& weight) {
        Borrowed bw = borrow(weight, "weight");
        lc_status st;
        {
            py::gil_scoped_release nogil;
            st = lc_weight_pack(bw.view(), &w_);
        }
        check(st);
    }
    // GGUF blocks (a buffer of N * K/32 blocks of `type`), kept quantized.
    PackedWeight(int32_t type, const py::object& blocks, int64_t n, int64_t k) {
        // Bytes in C order (a copy only if the buffer is strided or not uint8).
        using Bytes = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;
        const Bytes arr = Bytes::ensure(blocks);
        if (!arr) throw py::value_error("blocks must be a buffer of bytes (numpy uint8, bytes)");
        const int64_t nbytes = int64_t(arr.nbytes());
        const void* data = arr.data();
        lc_status st;
        {
            py::gil_scoped_release nogil;
            st = lc_weight_pack_quant(type, data, nbytes, n, k, &w_);
        }
        check(st);
    }
    ~PackedWeight() { lc_weight_destroy(w_); }
    PackedWeight(const PackedWeight&) = delete;
    PackedWeight& operator=(const PackedWeight&) = delete;

    const lc_weight* get() const { return w_; }
    int64_t n() const { return info().n; }
    int64_t k() const { return info().k; }
    int64_t nbytes() const { return info().nbytes; }
    std::string dtype() const {
        if (const int32_t t = quant_type()) return lc::quant::name(t);
        return info().dtype == LC_DTYPE_BF16 ? "bfloat16" : "float32";
    }
    int32_t quant_type() const {
        int32_t t = 0;
        check(lc_weight_quant_type(w_, &t));
        return t;
    }

    py::object rows(const py::handle& ids, const py::object& out) const {
        IntArray<int64_t> rows(ids, "rows");
        Borrowed bo = borrow(out, "out");
        lc_status st;
        {
            py::gil_scoped_release nogil;
            st = lc_weight_rows(w_, rows.data(), rows.size(), bo.view());
        }
        check(st);
        return out;
    }

   private:
    struct Info {
        int64_t n, k, nbytes;
        int32_t dtype;
    };
    Info info() const {
        Info i{};
        check(lc_weight_info(w_, &i.n, &i.k, &i.dtype, &i.nbytes));
        return i;
    }
    lc_weight* w_ = nullptr;
};

}  // namespace lcpy
