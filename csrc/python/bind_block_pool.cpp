#include "binding.h"

namespace lcpy {

void bind_block_pool(py::module_& m) {}

}  // namespace lcpy
