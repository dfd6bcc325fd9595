/* Anchor so the shared library has a source of its own; the code comes from llmcore_static. */
typedef int llmcore_abi_anchor_t;
