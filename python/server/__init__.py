"""The HTTP side of llmserve: `python -m server` serves an OpenAI-compatible API."""

__version__ = "0.1.0"
