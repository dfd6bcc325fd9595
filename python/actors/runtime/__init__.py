"""The Trio actors that run the engine: tokenizer, scheduler, engine and metrics.

Everything here is engine-side: it imports no HTTP framework and knows nothing of the
OpenAI protocol. The HTTP side hands in a `RequestState` and reads its `Outbox`.
"""
