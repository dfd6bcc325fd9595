/* A host program in C11 that links only the shared library libllmcore. */
#include <stdio.h>

#include "llmcore/llmcore.h"

int main(void) {
    printf("llmcore %s (%s)\n", lc_version(), lc_build_features());
    return lc_abi_version() == LC_ABI_VERSION ? 0 : 1;
}
