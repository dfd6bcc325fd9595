#include "binding.h"

namespace lcpy {

void bind_sampling(py::module_& m) {}

}  // namespace lcpy
