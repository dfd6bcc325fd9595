"""actors: the engine side of the server (scheduler, KV manager, runner, models, loader).

Importing this package must stay cheap: no torch, no transformers. Heavy modules
(``actors.models``, ``actors.loader``) are imported by the code that needs them.
"""

from __future__ import annotations

__all__: list[str] = []
