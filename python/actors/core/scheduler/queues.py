"""Waiting queues: the order in which waiting sequences are admitted.

FCFS: arrival order; a preempted sequence goes back to the FRONT (it was admitted
before everything still waiting). Priority: lower ``priority`` first, then earlier
arrival, then lower seq_id; a preempted sequence simply re-enters by that key, which
puts it ahead of every later arrival of its priority.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from actors.core.sequence import Sequence

__all__ = ["FcfsQueue", "PriorityQueue", "WaitingQueue", "make_waiting_queue"]


class WaitingQueue:
    def push(self, seq: Sequence) -> None:
        raise NotImplementedError

    def push_front(self, seq: Sequence) -> None:
        """Re-queues a preempted sequence."""
        raise NotImplementedError

    def peek(self) -> Sequence:
        raise NotImplementedError

    def pop(self) -> Sequence:
        raise NotImplementedError

    def remove(self, seq: Sequence) -> None:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Sequence]:
        raise NotImplementedError


class FcfsQueue(WaitingQueue):
    def __init__(self) -> None:
        self._q: deque[Sequence] = deque()

    def push(self, seq: Sequence) -> None:
        self._q.append(seq)

    def push_front(self, seq: Sequence) -> None:
        self._q.appendleft(seq)

    def peek(self) -> Sequence:
        return self._q[0]

    def pop(self) -> Sequence:
        return self._q.popleft()

    def remove(self, seq: Sequence) -> None:
        self._q.remove(seq)

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._q)


def priority_key(seq: Sequence) -> tuple[int, float, int]:
    return (seq.priority, seq.arrival_time, seq.seq_id)


class PriorityQueue(WaitingQueue):
    def __init__(self) -> None:
        self._heap: list[tuple[tuple[int, float, int], Sequence]] = []

    def push(self, seq: Sequence) -> None:
        heapq.heappush(self._heap, (priority_key(seq), seq))

    push_front = push

    def peek(self) -> Sequence:
        return self._heap[0][1]

    def pop(self) -> Sequence:
        return heapq.heappop(self._heap)[1]

    def remove(self, seq: Sequence) -> None:
        # O(n); aborts are rare next to steps.
        self._heap = [e for e in self._heap if e[1] is not seq]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Sequence]:
        return (e[1] for e in sorted(self._heap, key=lambda e: e[0]))


def make_waiting_queue(policy: str) -> WaitingQueue:
    if policy == "fcfs":
        return FcfsQueue()
    if policy == "priority":
        return PriorityQueue()
    raise ValueError(f"unknown scheduling policy {policy!r} (expected 'fcfs' or 'priority')")
