"""The engine actor's operator commands: answered between steps, on one-shot channels.

    admin --await control(Control)--> engine actor --ControlResult (one-shot reply)

Commands that decide whether the actor steps are its own (vLLM's pause and sleep), and
their states and order of operations are the pause machine's (actors.runtime.pause_states):
``pause`` (modes abort, wait, keep), ``resume``, ``sleep``, ``wake_up``, ``is_paused``,
``is_sleeping``, and ``release_kv_cache_memory``, which needs a pause that has applied. ``abort_requests`` is answered once the aborts the tokenizer sent for it
have been applied (the tokenizer matches the ids: it owns the requests). Every other
command is the core's; those that load or free memory (a LoRA load included) run in the
worker thread, under the same limiter as a step.

A caller that leaves before its answer (a client timeout cancels its handler) has closed
its reply channel: the command still applies and the answer is dropped, never raised into
the actor.

EngineControls is the half of EngineActor (actors.runtime.engine_actor) that answers them;
the actor's fields it reads are set in EngineActor.__init__.
"""

from __future__ import annotations

import logging

import trio

from actors.messages import Control, ControlResult
from actors.runtime.pause_states import PAUSE_MODES, Transition

__all__ = ["EngineControls", "PAUSE_MODES"]

log = logging.getLogger("actors.runtime.engine")

# Core commands that allocate, free or load memory: run in the worker thread.
_HEAVY_CONTROLS = frozenset({"sleep", "wake_up", "update_weights", "finish_weight_update",
                             "start_profile", "stop_profile", "load_lora_adapter",
                             "release_kv_cache_memory", "reset_encoder_cache"})
_ACTOR_CONTROLS = frozenset({"pause", "resume", "is_paused", "is_sleeping",
                             "abort_requests", "sleep", "wake_up", "release_kv_cache_memory"})

Reply = trio.MemorySendChannel[ControlResult]


class EngineControls:
    """Operator commands of the engine actor (see the module's docstring)."""

    async def control(self, command: Control) -> ControlResult:
        """Applies an operator command between steps and returns the answer."""
        if self._failed:
            return ControlResult(False, error="the engine has failed")
        if not self._stepping:  # nothing steps any more: no step to wait for
            return self._apply_control(command)
        reply_send, reply_recv = trio.open_memory_channel[ControlResult](1)
        self._controls.append((command, reply_send))
        self._wakeup.set()
        async with reply_recv:
            return await reply_recv.receive()

    def _apply_control(self, command: Control) -> ControlResult:
        try:
            return self._core.control(command)
        except Exception as exc:  # an operator command must not take the engine down
            log.exception("control %s failed", command.command)
            return ControlResult(False, error=f"{command.command} failed: {type(exc).__name__}")

    async def _apply_heavy(self, command: Control) -> ControlResult:
        if command.command not in _HEAVY_CONTROLS:
            return self._apply_control(command)
        return await trio.to_thread.run_sync(self._apply_control, command,
                                             limiter=self._limiter)

    async def _answer_controls(self) -> None:
        controls, self._controls = self._controls, []
        for command, reply in controls:
            if self._failed:
                _reply(reply, ControlResult(False, error="the engine has failed"))
            else:
                await self._operate(command, reply)
        await self._carry_out(self._pause.drained())

    def _answer_stopped(self) -> None:
        """The loop has ended: core commands still apply; the actor's own cannot."""
        pending = self._controls + [p.ticket for p in self._pause.take_pending()]
        self._controls = []
        for command, reply in pending:
            if self._failed:
                result = ControlResult(False, error="the engine has failed")
            elif command.command in _ACTOR_CONTROLS:
                result = ControlResult(False, error="the engine has stopped", reason="conflict")
            else:
                result = self._apply_control(command)
            _reply(reply, result)

    async def _operate(self, command: Control, reply: Reply) -> None:
        """Applies one command; a pause or sleep of mode wait is answered once drained."""
        args = dict(command.args)
        ticket = (command, reply)
        pause = self._pause
        match command.command:
            case "pause":
                await self._carry_out(pause.pause(str(args.get("mode", "abort")),
                                                  bool(args.get("clear_cache", True)), ticket))
            case "resume":
                await self._carry_out(pause.resume(ticket))
                self._wakeup.set()
            case "is_paused":
                _reply(reply, ControlResult(True, pause.pause_mode is not None))
            case "is_sleeping":
                _reply(reply, ControlResult(True, pause.is_sleeping))
            case "abort_requests":
                self._apply_aborts()
                _reply(reply, ControlResult(True))
            case "sleep":
                await self._carry_out(pause.sleep(str(args.get("mode", "abort")),
                                                  int(args.get("level", 1)), ticket))
            case "release_kv_cache_memory":
                if not pause.released_allowed:
                    _reply(reply, ControlResult(False, reason="conflict", error=(
                        "release_kv_cache_memory requires a completed pause first (/pause, "
                        "with no request left in the engine)")))
                    return
                result = await self._apply_heavy(command)
                if result.ok:
                    pause.released()
                _reply(reply, result)
            case "wake_up":
                await self._carry_out(pause.wake_up())
                result = await self._apply_heavy(command)
                if result.ok:
                    pause.woke(bool(result.value["asleep"]))
                    self._wakeup.set()
                _reply(reply, result)
            case _:
                _reply(reply, await self._apply_heavy(command))

    async def _carry_out(self, transition: Transition[tuple[Control, Reply]]) -> None:
        for (_command, reply), result in transition.replies:
            _reply(reply, result)
        for pending in transition.sleep_now:
            command, reply = pending.ticket
            result = await self._apply_heavy(command)
            if result.ok:
                self._pause.slept(pending.level)
            _reply(reply, result)


def _reply(reply: Reply, result: ControlResult) -> None:
    """Answers one caller. A caller that gave up (its client left, a proxy timed out) has
    closed its end: the command was applied all the same, and nobody is told. That is not
    an engine failure."""
    try:
        reply.send_nowait(result)  # its own channel of size one, never full
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        log.info("an operator call was answered after its caller left (ok=%s)", result.ok)
    finally:
        reply.close()
