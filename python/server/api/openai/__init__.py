"""The OpenAI-compatible API: one module per route family (each registers its own routes),
the request bodies under protocol/."""
