"""The engine actor's operator commands: answered between steps, on one-shot channels.

    admin --await control(Control)--> engine actor --ControlResult (one-shot reply)

Commands that decide whether the actor steps are its own (vLLM's pause and sleep):
``pause`` with mode ``abort`` (every in-flight request ends with finish_reason "abort", as a
client sees it), ``wait`` (the reply comes once the core has drained) or ``keep`` (nothing
steps; new requests queue); in abort and wait modes new requests are refused
(GenerationPaused, a 503) until ``resume``. ``sleep`` pauses the same way but queues new
requests, then frees the core's memory (actors.core.operator); ``wake_up`` restores it and
steps again. ``abort_requests`` ends requests by id, or all of them. Every other command is
the core's; those that load or free memory (a LoRA load included) run in the worker thread,
under the same limiter as a step.

The order of operations: a ``resume`` (``wake_up``) overtakes a pause (sleep) of mode
``wait`` still waiting for its drain, which is answered 409 and never applies. A caller
that leaves before its answer (a client timeout cancels its handler) has closed its reply
channel: the command still applies and the answer is dropped, never raised into the actor.

EngineControls is the half of EngineActor (actors.runtime.engine_actor) that holds this
state machine; the actor's fields it reads are set in EngineActor.__init__.
"""

from __future__ import annotations

import logging

import trio

from actors.messages import Control, ControlResult

log = logging.getLogger("actors.runtime.engine")

PAUSE_MODES = ("abort", "wait", "keep")
# Core commands that allocate, free or load memory: run in the worker thread.
_HEAVY_CONTROLS = frozenset({"sleep", "wake_up", "update_weights", "start_profile",
                             "stop_profile", "load_lora_adapter"})
_ACTOR_CONTROLS = frozenset({"pause", "resume", "is_paused", "is_sleeping",
                             "abort_requests", "sleep", "wake_up"})



class EngineControls:
    """Operator commands of the engine actor (see the module's docstring)."""

    async def control(self, command: Control) -> ControlResult:
        """Applies an operator command between steps and returns the core's answer."""
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
                result: ControlResult | None = ControlResult(False,
                                                             error="the engine has failed")
            else:
                result = await self._operate(command)
            if result is None:  # mode "wait": answered once the core has drained
                self._draining.append((command, reply))
                continue
            _reply(reply, result)
        if self._draining and not self._core.has_unfinished():
            draining, self._draining = self._draining, []
            for command, reply in draining:
                _reply(reply, await self._drained(command))

    def _answer_stopped(self) -> None:
        """The loop has ended: core commands still apply; the actor's own cannot."""
        pending = self._controls + self._draining
        self._controls, self._draining = [], []
        for command, reply in pending:
            if self._failed:
                result = ControlResult(False, error="the engine has failed")
            elif command.command in _ACTOR_CONTROLS:
                result = ControlResult(False, error="the engine has stopped", reason="conflict")
            else:
                result = self._apply_control(command)
            _reply(reply, result)

    async def _operate(self, command: Control) -> ControlResult | None:
        """Applies one command; None defers the answer until the core has drained."""
        args = dict(command.args)
        match command.command:
            case "pause":
                return self._pause(str(args.get("mode", "abort")),
                                   bool(args.get("clear_cache", True)))
            case "resume":
                self._overtake_draining("pause", "resumed before the drain ended")
                self._pause_mode = None
                self.refusing_new = False
                self._holding = False
                self._wakeup.set()
                return ControlResult(True)
            case "is_paused":
                return ControlResult(True, self._pause_mode is not None)
            case "is_sleeping":  # vLLM's: any pause of the scheduler counts as asleep
                return ControlResult(True, self._sleep_level is not None
                                     or self._pause_mode is not None)
            case "abort_requests":
                return ControlResult(True, self._abort_requests(args.get("request_ids")))
            case "sleep":
                return await self._sleep(command, str(args.get("mode", "abort")))
            case "wake_up":
                self._overtake_draining("sleep", "woken up before the drain ended")
                return await self._wake_up(command)
        return await self._apply_heavy(command)

    def _overtake_draining(self, command: str, why: str) -> None:
        """The order of operations: a later resume (wake_up) wins over a pause (sleep) of
        mode "wait" still waiting for the drain; that pause is answered 409 and never
        applies, so the engine is not left paused (asleep) with nobody to resume it."""
        kept = []
        for pending, reply in self._draining:
            if pending.command == command:
                _reply(reply, ControlResult(False, error=f"{command} was overtaken: {why}",
                                            reason="conflict"))
            else:
                kept.append((pending, reply))
        self._draining = kept

    def _pause(self, mode: str, clear_cache: bool) -> ControlResult | None:
        if mode not in PAUSE_MODES:
            return ControlResult(False, error=f"Invalid pause mode: {mode}", reason="invalid")
        self._pause_mode = mode
        self.refusing_new = mode != "keep"
        if mode == "abort":
            self._abort_requests(None)
        if mode == "keep" or not self._core.has_unfinished():
            return self._paused(mode, clear_cache)
        return None  # wait: answered by _drained

    def _paused(self, mode: str, clear_cache: bool) -> ControlResult:
        self._holding = True
        if clear_cache and mode != "keep":
            self._apply_control(Control("reset_prefix_cache"))
        return ControlResult(True)

    async def _sleep(self, command: Control, mode: str) -> ControlResult | None:
        level = int(dict(command.args).get("level", 1))
        if mode not in PAUSE_MODES:
            return ControlResult(False, error=f"Invalid pause mode: {mode}", reason="invalid")
        if level >= 1 and mode == "keep" and self._core.has_unfinished():
            return ControlResult(False, reason="conflict", error=(
                f"sleep level {level} frees the KV cache, so mode=keep cannot keep the "
                "running requests; use mode=abort or mode=wait"))
        if mode == "abort":
            self._abort_requests(None)
        if mode == "wait" and self._core.has_unfinished():
            return None
        return await self._asleep(command)

    async def _asleep(self, command: Control) -> ControlResult:
        level = int(dict(command.args).get("level", 1))
        result = await self._apply_heavy(command)
        if result.ok:
            self._sleep_level = max(level, self._sleep_level or 0)
        return result

    async def _wake_up(self, command: Control) -> ControlResult:
        result = await self._apply_heavy(command)
        if result.ok and not result.value["asleep"]:
            self._sleep_level = None
            self._wakeup.set()
        return result

    async def _drained(self, command: Control) -> ControlResult:
        args = dict(command.args)
        if command.command == "sleep":
            return await self._asleep(command)
        return self._paused(str(args.get("mode", "wait")), bool(args.get("clear_cache", True)))

    def _abort_requests(self, request_ids: list[str] | None) -> int:
        """Ends every tokenized request (all, or those whose id, response id or internal id
        is named) with finish_reason "abort"; returns how many."""
        wanted = set(request_ids or ())
        count = 0
        for state in list(self._registry.requests.values()):
            if not state.ready.is_set() or state.retired.is_set():
                continue
            if wanted and not wanted & _names_of(state.request_id):
                continue
            self.abort_state(state)
            count += 1
        self._apply_aborts()
        return count


def _reply(reply: trio.MemorySendChannel[ControlResult], result: ControlResult) -> None:
    """Answers one caller. A caller that gave up (its client left, a proxy timed out) has
    closed its end: the command was applied all the same, and nobody is told. That is not
    an engine failure."""
    try:
        reply.send_nowait(result)  # its own channel of size one, never full
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        log.info("an operator call was answered after its caller left (ok=%s)", result.ok)
    finally:
        reply.close()


def _names_of(internal_id: str) -> set[str]:
    """The ids an operator may name a request by: ours, the client's (X-Request-Id or the
    body's request_id) and the response ids built from it."""
    public = internal_id.rsplit(".", 1)[0]
    return {internal_id, public, f"cmpl-{public}", f"chatcmpl-{public}"}
