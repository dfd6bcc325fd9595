"""The engine core: LLMEngine (scheduler, KV manager, model runner), stepped synchronously.

The front end (``actors.runtime``) drives it only through ``actors.core.protocol.EngineCore``
and the messages of ``actors.messages``.
"""
