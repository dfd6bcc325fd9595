"""The core's LoRA adapters: which are loaded, in which slot, and which are retiring.

The front end names adapters and gives each a fresh integer id (never reused, so a name
unloaded and loaded again gets a new prefix-cache namespace); ``Admit.lora_id`` carries it.
Loading reads and checks the PEFT files, then writes the adapter into a free slot of the
runner's ``LoraStacks``, between steps (``LLMEngine.control``).

Unloading never fails a request in flight: the adapter stops being routable at once (the
front end forgets the name), but it only becomes "retiring": its weights stay, and a
request the front end resolved to it just before the unload is still admitted. Its slot
is reclaimed when a load needs one and no sequence of the core runs under it any more. A
load that finds every slot taken by live or still-used adapters is refused
(``--max-loras``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from actors.messages import ControlResult
from actors.models.config import ModelConfig
from actors.models.lora import LoraError, LoraStacks, load_adapter

__all__ = ["LoraAdapters"]


class LoraAdapters:
    def __init__(self, cfg: ModelConfig, max_loras: int, max_rank: int,
                 in_use: Callable[[], set[int]], **stacks_args: Any) -> None:
        """in_use: the adapter ids of the core's unfinished sequences; stacks_args: the
        slot tensors' dtype and device (LoraStacks)."""
        self.cfg, self.max_loras, self.max_rank = cfg, max_loras, max_rank
        self.stacks = LoraStacks(cfg, max_loras, max_rank, **stacks_args)
        self.slots: dict[int, int] = {}  # adapter id -> slot (live and retiring)
        self.retiring: set[int] = set()
        self._in_use = in_use

    def serves(self, lora_id: int) -> bool:
        """Whether a request may run under the adapter (live, or retiring but not gone)."""
        return lora_id in self.slots

    def load(self, lora_id: int, path: str) -> ControlResult:
        if lora_id in self.slots:
            return ControlResult(False, error=f"LoRA id {lora_id} is already loaded",
                                 reason="conflict")
        try:
            adapter = load_adapter(path, self.cfg, self.max_rank)
        except (LoraError, OSError) as exc:
            return ControlResult(False, error=str(exc), reason="invalid")
        slot = self._free_slot()
        if slot is None:
            return ControlResult(False, reason="conflict", error=(
                f"all {self.max_loras} LoRA slots are taken (--max-loras); unload an "
                "adapter first"))
        self.stacks.write(slot, adapter)
        self.slots[lora_id] = slot
        return ControlResult(True, value={"rank": adapter.rank})

    def unload(self, lora_id: int) -> ControlResult:
        if lora_id not in self.slots or lora_id in self.retiring:
            return ControlResult(False, error=f"LoRA id {lora_id} is not loaded",
                                 reason="invalid")
        self.retiring.add(lora_id)
        return ControlResult(True)

    def _reclaim(self) -> None:
        """Frees the slots of retiring adapters no sequence runs under any more."""
        idle = self.retiring - self._in_use()
        for lid in idle:
            self.stacks.clear(self.slots.pop(lid))
        self.retiring -= idle

    def _free_slot(self) -> int | None:
        self._reclaim()
        taken = set(self.slots.values())
        return next((s for s in range(self.max_loras) if s not in taken), None)
