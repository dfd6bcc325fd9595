"""What the HTTP routes share: the model's facts, the runtime handles and the health flags."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from actors.runtime.admission import Admission
from actors.runtime.metrics_actor import MetricsActor
from actors.runtime.request import Registry
from actors.runtime.system import ActorSystem
from server.frontend.chat_template import ChatRenderer
from server.config import ServerConfig
from server.fingerprint import system_fingerprint
from actors.params.limits import RequestLimits

if TYPE_CHECKING:  # annotations only: these modules import this one, or are heavy
    from transformers import PreTrainedTokenizerBase

    from actors.runtime.prompt_bounds import PromptCharBound
    from actors.text.detokenizer import TokenTexts
    from server.api.elastic import Elastic
    from server.api.lora import LoraNames
    from server.transport import ConnectionTable
    from server.write_watchdog import WriteWatchdog


@dataclass
class Health:
    loading: bool = True
    draining: bool = False
    failed: bool = False

    @property
    def serving(self) -> bool:
        return not (self.loading or self.draining or self.failed)


@dataclass
class ServerState:
    config: ServerConfig
    health: Health = field(default_factory=Health)
    started_at: float = field(default_factory=time.time)
    # Set once the actors are up (None while loading). `actors` is the engine side's handle;
    # the fields below it are taken from it (or from the engine's info) for the routes.
    actors: ActorSystem | None = None
    tokenizer: PreTrainedTokenizerBase | None = None
    limits: RequestLimits | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    renderer: ChatRenderer | None = None
    admission: Admission | None = None
    registry: Registry | None = None
    metrics: MetricsActor | None = None
    reaper: trio.Nursery | None = None
    model_root: str = ""
    # From the tokenizer actor: logprob token texts (actors.text.detokenizer.TokenTexts)
    # and the prompt length bound (actors.runtime.prompt_bounds.PromptCharBound).
    token_texts: TokenTexts | None = None
    prompt_bound: PromptCharBound | None = None
    write_watchdog: WriteWatchdog | None = None  # set by create_app
    connections: ConnectionTable | None = None  # set by the supervisor
    lora_names: LoraNames | None = None  # the served adapters, once one loads
    # data-parallel rank -> its KV-event publisher (vLLM's KVEventsConfig fields), for
    # /kv_event_sources; empty without --kv-events-config
    kv_event_sources: dict[int, dict[str, Any]] = field(default_factory=dict)
    elastic: Elastic | None = None  # --enable-elastic-ep: /scale_elastic_ep's settings
    _fingerprint: str | None = field(default=None, repr=False)

    @property
    def model_name(self) -> str:
        return self.config.served_model_names[0]

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = system_fingerprint(self.config, self.model_root)
        return self._fingerprint
