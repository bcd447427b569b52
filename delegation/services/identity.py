"""Who is calling: the bottom of the services, imported by every other service module.

``Connection`` is one authenticated runner socket; ``Caller`` is who calls a child method (a
runner's connection, and the door it came through); ``Actor`` is who performs an action, for
permission checks, event attribution and the audit log. Nothing here touches the database.
"""

from __future__ import annotations

from dataclasses import dataclass

from delegation.models import AuditEntry, Run, Runner, RunVia


@dataclass(frozen=True)
class Connection:
    """One authenticated runner socket, as the consumer knows it."""

    runner_pk: int
    generation: int = 0
    declared_depth: int | None = None
    channel_name: str = ""
    # The server's address as this socket reached it (http[s]://host), for run tokens' url.
    base_url: str = ""
    # The token hash the socket authenticated with: after a rotation the socket's old
    # credential must not register (the handshake is the only other place it is checked).
    credential: str = ""


@dataclass(frozen=True)
class Actor:
    """Who performs an action, for permission checks, event attribution and the audit log."""

    label: str
    via: str
    user: object | None = None
    runner_pk: int | None = None

    @classmethod
    def for_user(cls, user, via: str) -> Actor:
        return cls(label=f"user:{user.get_username()}", via=via, user=user)

    @classmethod
    def for_runner(cls, runner: Runner, via: str = AuditEntry.Via.RUNNER) -> Actor:
        """The runner itself, or (``via`` mcp) an agent it hosts, holding a run token."""
        return cls(label=f"{via}:{runner.name}", via=via, runner_pk=runner.pk)

    @classmethod
    def system(cls, why: str = "system") -> Actor:
        return cls(label=why, via=AuditEntry.Via.SYSTEM)


@dataclass(frozen=True)
class Caller:
    """Who calls a child method: a runner's connection, and how the call arrived.

    The runner socket builds one from its connection. The MCP server builds one from a run
    token: the run's runner on its current connection, ``via`` mcp, and the level the agent
    declared (header or ``_meta``), which may raise the run's recorded level, never lower it.
    """

    conn: Connection
    via: str = RunVia.RUNNER.value
    declared_depth: int | None = None

    def level_of(self, run: Run) -> int:
        if self.declared_depth is None:
            return run.depth
        return max(run.depth, self.declared_depth)

    def label(self, runner: Runner) -> str:
        """How events and the audit log name this caller: ``runner:<name>`` or ``mcp:<name>``."""
        return f"{self.via}:{runner.name}"

    def actor(self, runner: Runner) -> Actor:
        return Actor.for_runner(runner, self.via)


def as_caller(caller: Caller | Connection) -> Caller:
    return caller if isinstance(caller, Caller) else Caller(conn=caller)
