"""The HTTP APIs the server mounts: the OpenAI-compatible one under openai/, the operational
routes in ops. Each API module exposes `register(app, srv)`; server.app mounts them."""
