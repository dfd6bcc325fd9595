#include "binding.h"

namespace lcpy {

void bind_attention(py::module_& m) {}

}  // namespace lcpy
