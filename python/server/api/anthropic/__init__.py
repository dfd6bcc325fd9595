"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) over the same
chat rendering, tool planning and generation service as OpenAI's chat route."""
