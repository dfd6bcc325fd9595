"""What several API dialects share that is no one dialect's: the vLLM request vocabulary
(`protocol`: sampling fields, structured outputs; `chat_protocol` and `completion_protocol`:
the chat and completions bodies that OpenAI's routes, the scale-out render routes and the
Anthropic translation parse; `messages_protocol` and `messages_body`: Anthropic's Messages
bodies and their translation onto the chat body, which /v1/messages and the scale-out
/v1/messages/render share), the checks of those bodies with their SamplingParams
(`chat_body`, `completion_body`, `params`, `structured`, `unsupported`), the decoding of
completions' prompt_embeds (`embeds`), the logprob and
usage JSON and the stream loop of the OpenAI-shaped answers (`render_json`, `stream`), and
prompt tokenizing without generating (`tokens`). Dialects import from here and from
server.frontend, never from each other."""
