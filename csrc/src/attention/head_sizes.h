// The head sizes the paged attention kernels are compiled for, in one list: the
// boundary check (supported_head_size) and every dispatch (the CPU kernels'
// run_item_kt, the CUDA launch) read it, so adding a size is one edit here.
#pragma once

#include <cstdint>
#include <type_traits>

namespace lc::attn {

template <int... D>
struct HeadSizeList {
    static constexpr bool has(int64_t d) { return ((d == D) || ...); }

    // Calls f(std::integral_constant<int, d>{}) for the listed size d; false when
    // d is none of them.
    template <class F>
    static bool visit(int64_t d, F&& f) {
        return ((d == D ? (f(std::integral_constant<int, D>{}), true) : false) || ...);
    }
};

using HeadSizes = HeadSizeList<32, 64, 80, 96, 128, 256>;

}  // namespace lc::attn
