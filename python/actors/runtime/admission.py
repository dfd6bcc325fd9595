"""Admission: the one place where the server says no.

The HTTP edge takes one slot per engine sequence (a request with n=4 and two prompts takes
8) before doing any work, and returns them only after every sequence has retired. All
internal channel bounds are stated in terms of `capacity`.
"""

from __future__ import annotations


class Admission:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("admission capacity must be at least 1")
        self.capacity = capacity
        self.in_use = 0

    def try_acquire(self, slots: int) -> bool:
        """Take `slots` at once or none (a request never holds part of what it needs)."""
        if slots < 1 or self.in_use + slots > self.capacity:
            return False
        self.in_use += slots
        return True

    def release(self, slots: int) -> None:
        if slots > self.in_use:
            raise RuntimeError("admission released more slots than it gave out")
        self.in_use -= slots
