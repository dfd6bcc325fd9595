"""The dialect-neutral chat core: what every chat dialect (OpenAI chat and its batch form,
Responses, Anthropic messages, the scale-out render) shares between its request body and
the generation service.

- `request.ChatRequest`: a frozen chat request in no dialect's shape; each dialect's
  `to_chat()` builds one from its own body;
- `tools`: the tool plan (vLLM's checks of tools and tool_choice, the constraint of a
  forced choice, the parser of "auto") and the assistant history the template reads;
- `tool_parsers/`: the tool-call parsers, whole and streamed;
- `reasoning/`: the reasoning parsers, which split a choice's text into reasoning and
  content, whole and streamed;
- `reasoning_plan`: the reasoning parser applied to a request and its choices (wired into
  OpenAI chat completions);
- `tool_calls`: the per-choice state that splits a choice's text into content and tool
  calls as it streams (each dialect shapes what it yields);
- `render.render_call`: the chat template's deferred render of a `ChatRequest`.
"""
