// The one check macro of the C++ tests: a failed CHECK prints where and why and
// counts, so one run reports every failure; main returns lctest::finish().
//   CHECK(cond);                       CHECK(cond, "got %d", value);
#pragma once

#include <cstdio>

namespace lctest {
inline int failures = 0;

inline int finish() {
    if (failures) std::fprintf(stderr, "%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
}  // namespace lctest

#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            std::fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            std::fprintf(stderr, "" __VA_ARGS__);                                         \
            std::fprintf(stderr, "\n");                                                   \
            ++lctest::failures;                                                           \
        }                                                                                 \
    } while (0)
