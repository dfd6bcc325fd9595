"""Pydantic models of the OpenAI-compatible request bodies (responses are plain dicts)."""
