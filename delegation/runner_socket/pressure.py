"""Back-pressure of a saturated process on its runner sockets (issue 39).

Frames a process has taken and not yet answered wait in the sockets' inboxes and in the group
commit's queue. Left alone, a process offered more than it stores lets that wait grow without
bound: at 1,000 sockets it reached minutes, and frames went unanswered for 60 s. Instead, once
the oldest frame the process holds has waited ``RUN_EVENT_WAIT_MAX_MS`` (or it holds
``RUN_EVENT_PENDING_MAX`` frames, a ceiling on memory), a new ``run.event`` request is answered
at once, before it waits anywhere or touches the database, with −32603 and
``data: {"retryable": true, "retryAfterMs": N}``: nothing of it is stored, and the runner sends
it again after ``N`` ms (the SDK does, ``delegation.client.connection``), by then batched with
the events its agent emitted meanwhile. ``N`` is the process's own estimate of how long it
needs to answer what it holds (held frames over the rate it has been answering them), so a
process that drains fast asks for short pauses.

By the wait, not by a count of frames: a runner that waits for its answers (the SDK keeps one
frame in flight a run) is already slowed by the wait itself, and a process with many runs
holds many frames at a load it carries well. A count of 2,000 refused such runners early, and
their events waited three times longer for fewer stored (docs/explanation/performance.md).

Only ``run.event`` is refused: it is the volume, and the SPEC's ``from`` makes its retry exact.
Answers to the server's commands and the other methods wait their turn as before.
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
import weakref

from django.conf import settings

from delegation.errors import INTERNAL_ERROR, RpcError

RETRY_MIN_MS = 50
RETRY_MAX_MS = 5_000
# How fast the answering rate follows the process: a 2 s memory, so a pause asked for
# reflects the last few commits rather than the last one.
RATE_SECONDS = 2.0

_clock = time.monotonic  # a test moves it, not the whole process's clock
_per_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def frame_pressure() -> FramePressure:
    """This event loop's (one a server process; the test suite runs a loop per test)."""
    loop = asyncio.get_running_loop()
    pressure = _per_loop.get(loop)
    if pressure is None:
        pressure = _per_loop[loop] = FramePressure()
    return pressure


class FramePressure:
    """What the process's runner sockets hold: ``held`` frames received and not yet answered,
    when they arrived, and the rate at which they have been answered (frames/s, smoothed).

    Arrival times are kept in arrival order and the oldest dropped as frames are answered:
    sockets answer in their own order, so the head is the oldest frame held to within the
    frames one group commit takes together."""

    def __init__(self):
        self._arrivals: collections.deque[float] = collections.deque()
        self.rate = 0.0
        self._since = _clock()
        self._answered = 0
        self.refused = 0

    @property
    def held(self) -> int:
        return len(self._arrivals)

    def took(self, frames: int = 1) -> None:
        now = _clock()
        self._arrivals.extend([now] * frames)

    def _forget(self, frames: int) -> None:
        for _ in range(min(frames, len(self._arrivals))):
            self._arrivals.popleft()

    def answered(self, frames: int = 1) -> None:
        self._forget(frames)
        self._answered += frames
        now = _clock()
        elapsed = now - self._since
        if elapsed >= 0.1:
            weight = min(1.0, elapsed / RATE_SECONDS)
            self.rate += weight * (self._answered / elapsed - self.rate)
            self._since, self._answered = now, 0

    def dropped(self, frames: int) -> None:
        """Frames a closed socket held and will never answer."""
        self._forget(frames)

    def oldest_wait_ms(self) -> float:
        """How long the oldest frame held has waited so far; 0 when none is held."""
        if not self._arrivals:
            return 0.0
        return (_clock() - self._arrivals[0]) * 1000

    def saturated(self) -> bool:
        if self.held >= settings.RUN_EVENT_PENDING_MAX:
            return True
        return bool(self._arrivals) and self.oldest_wait_ms() >= settings.RUN_EVENT_WAIT_MAX_MS

    def retry_after_ms(self) -> int:
        """How long the process expects to need for what it holds, jittered by a quarter so
        the runners it refused together do not all come back in the same instant."""
        if self.rate > 0:
            estimate = 1000 * self.held / self.rate
        else:
            estimate = RETRY_MAX_MS / 5
        estimate *= random.uniform(0.75, 1.25)
        return int(min(RETRY_MAX_MS, max(RETRY_MIN_MS, estimate)))

    def busy(self) -> RpcError:
        """The answer to a ``run.event`` refused for back-pressure; counted in ``refused``."""
        self.refused += 1
        delay = self.retry_after_ms()
        return RpcError(
            INTERNAL_ERROR,
            f"server busy: {self.held} frames waiting in this process, the oldest for "
            f"{self.oldest_wait_ms():.0f} ms; nothing of this frame was stored, send it again "
            f"after {delay} ms",
            data={"retryable": True, "retryAfterMs": delay},
        )
