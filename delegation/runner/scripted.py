"""The ``scripted`` engine: a deterministic simulated agent.

Each run thinks, talks, uses tools (some fail), may delegate subtasks through ``child.start``,
reports usage and a result. What a run does is decided by a *plan*: how many children it asks
for, whether it runs long, whether it fails. A parent writes its children's plans into their
messages (``[scripted {...}]`` on the last line), so a whole tree follows from the root's plan
and the seed; a message without a plan gets one drawn from the seed and the run's path.

Behaviour the SPEC cares about:

- a depth refusal (−32010) is recorded as a ``text`` event and the run does the work itself;
- a steer shows up in the run's next ``text`` event ("Steered: I was told ...");
- a cancel stops the run within one pace tick (at most a second) and the host finishes it
  with ``cancelled: true``;
- with ``approval_rate``, a run sometimes asks an operator before a shell command
  (``approval.request``, SPEC §11) and waits for the decision, running the edited command
  when the operator edited it; with ``lease_rate``, a delegating run sometimes starts its
  children under a lease it keeps after it ends (until released or expired), so the demo
  shows both (issue 38).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from dataclasses import asdict, dataclass

from delegation.client import AdmissionRefused, DepthLimitReached, Preset, RpcError, event
from delegation.runner.host import Outcome, RunContext

PLAN_RE = re.compile(r"\n*\[scripted (\{[^\n]*\})\]\s*$")
TOOLS = ("read_file", "grep", "run_tests", "edit_file", "list_dir")
TOPICS = (
    "audit the parser",
    "write the migration",
    "review the API surface",
    "profile the hot loop",
    "triage flaky tests",
    "document the protocol",
    "port the CLI flags",
    "tighten input validation",
)


# The simulated model's price per million tokens (in, out, cache read, cache write), so the
# usage events carry a cost the way an agent's own report would (SPEC §10).
MODEL = "scripted-sonnet"
PRICES_PER_MTOK = (3.0, 15.0, 0.30, 3.75)


def turn_usage(rng: random.Random, turn: int) -> dict:
    """One model turn's usage: the prompt grows with the turn, most of it read from cache."""
    prompt = rng.randint(1_500, 6_000) + turn * rng.randint(800, 2_500)
    cached = int(prompt * rng.uniform(0.4, 0.85)) if turn else 0
    written = rng.randint(0, 1_200) if turn == 0 else rng.randint(0, 400)
    fresh = prompt - cached
    out = rng.randint(150, 1_800)
    price_in, price_out, price_read, price_write = PRICES_PER_MTOK
    cost = (fresh * price_in + out * price_out + cached * price_read + written * price_write) / 1e6
    return {
        "inputTokens": fresh,
        "outputTokens": out,
        "cacheReadTokens": cached,
        "cacheWriteTokens": written,
        "costUsd": round(cost, 6),
        "model": MODEL,
    }


def usage_text(usage: dict) -> str:
    return (
        f"tokens {usage['inputTokens']} in, {usage['outputTokens']} out, "
        f"{usage['cacheReadTokens']} cached, ${usage['costUsd']:.4f}"
    )


@dataclass
class ScriptedConfig:
    seed: int = 1
    pace: float = 0.3  # seconds between steps (capped at 1s so a cancel is seen in time)
    steps: int = 2  # tool steps per run
    fanout: int = 2  # children per delegating run (the most, in the sparse shape)
    depth: int = 4  # the deepest level runs try to create; above MaxDepth means a refusal
    shape: str = "full"  # full: every run below `depth` delegates `fanout`; sparse: demo tree
    fail_rate: float = 0.0  # share of children that fail
    tool_fail_rate: float = 0.25  # share of tool calls that report failure
    long_rate: float = 0.0  # share of children that keep working for `long_seconds`
    long_seconds: float = 30.0
    poll: float = 0.3  # child.read interval while waiting for children
    approval_rate: float = 0.0  # share of runs that ask an operator before a shell command
    lease_rate: float = 0.0  # share of delegating runs that start their children under a lease


@dataclass
class Plan:
    path: str
    spawn: int = 0
    long: bool = False
    fail: bool = False
    spine: bool = False

    def render(self) -> str:
        return f"[scripted {json.dumps(asdict(self), separators=(',', ':'))}]"


def split_plan(message: str) -> tuple[str, Plan | None]:
    match = PLAN_RE.search(message or "")
    if not match:
        return (message or "").strip(), None
    try:
        raw = json.loads(match.group(1))
        plan = Plan(
            path=str(raw["path"]),
            spawn=int(raw.get("spawn", 0)),
            long=bool(raw.get("long", False)),
            fail=bool(raw.get("fail", False)),
            spine=bool(raw.get("spine", False)),
        )
    except (ValueError, KeyError, TypeError):
        return message.strip(), None
    return message[: match.start()].strip(), plan


class ScriptedEngine:
    name = "scripted"

    def __init__(self, config: ScriptedConfig | None = None):
        self.config = config or ScriptedConfig()
        self.cancel_grace = 1.0

    # -- registration ------------------------------------------------------------------

    def presets(self) -> list[Preset]:
        return [
            Preset("planner", "You are a simulated planning agent. Split the task, delegate."),
            Preset(
                "worker",
                "You are a simulated worker agent. Do the subtask, report back.",
                {"maxTurns": 20},
            ),
        ]

    def check(self, command, host) -> None:
        if command.preset.name not in {p.name for p in self.presets()}:
            raise RpcError(-32602, f"preset {command.preset.name!r} is not offered here")

    # -- plans -------------------------------------------------------------------------

    def rng(self, *parts) -> random.Random:
        return random.Random("/".join(str(p) for p in (self.config.seed, *parts)))

    def may_try(self, level: int) -> bool:
        """Whether a run at ``level`` tries to delegate (``depth`` is the deepest level)."""
        return level + 1 <= self.config.depth

    def root_plan(self, path: str, level: int = 0) -> Plan:
        cfg, rng = self.config, self.rng(path, "plan")
        if not self.may_try(level):
            return Plan(path=path)
        if cfg.shape == "sparse":
            return Plan(path=path, spawn=rng.randint(1, max(1, cfg.fanout)), spine=True)
        return Plan(path=path, spawn=cfg.fanout, spine=True)

    def child_plan(self, parent: Plan, index: int, child_level: int) -> Plan:
        cfg = self.config
        path = f"{parent.path}.{index + 1}"
        rng = self.rng(path, "plan")
        spine = parent.spine and index == 0
        long = rng.random() < cfg.long_rate
        fail = not long and rng.random() < cfg.fail_rate
        if cfg.shape == "sparse":
            if spine and self.may_try(child_level):
                spawn = rng.randint(1, max(1, cfg.fanout))
            elif self.may_try(child_level + 1):
                # Off the spine nothing reaches the cap, so exactly one branch is refused.
                spawn = rng.choice((0, 0, 1))
            else:
                spawn = 0
        else:
            spawn = cfg.fanout if self.may_try(child_level) else 0
        if spawn:
            long = False  # a delegating run already waits for its children
        return Plan(path=path, spawn=spawn, long=long, fail=fail, spine=spine)

    def root_message(self, path: str) -> str:
        topic = self.rng(path, "topic").choice(TOPICS)
        return f"Task {path}: {topic}\n\n{self.root_plan(path).render()}"

    # -- execution ---------------------------------------------------------------------

    @property
    def pace(self) -> float:
        return min(max(self.config.pace, 0.0), 1.0)

    async def say(self, ctx: RunContext, text: str) -> None:
        steers = ctx.take_steers()
        if steers:
            told = "; ".join(f'"{message}"' for message in steers)
            text = f"Steered: I was told {told}. Adjusting course. {text}"
        await ctx.emit(event("text", text))

    async def run(self, ctx: RunContext) -> Outcome:
        task, plan = split_plan(ctx.message)
        if plan is None:
            # A root opened with a plain task grows a tree (opened here, or launched by an
            # operator through run.execute: no parent); a child asked for by some other agent
            # without a plan just does its work.
            top = ctx.identity is None or not ctx.identity.parent_run_id
            plan = (
                self.root_plan(ctx.conversation_id, ctx.depth)
                if top
                else Plan(path=ctx.conversation_id)
            )
        rng = self.rng(plan.path, "run")
        await ctx.emit(event("thinking", f"Level {ctx.depth}: planning how to {task[:200]}"))
        await self.say(ctx, f"Starting on: {task[:200]}")
        # A delegating run asks once its children are started (under its lease, if any), so
        # the demo shows both at once; any other run asks first.
        asks = self.shows(plan, "approval", self.config.approval_rate)
        if asks and not plan.spawn:
            await self.ask_step(ctx, task, plan)
        for step in range(self.config.steps):
            await self.tool_step(ctx, rng, step)
            await self.report_usage(ctx, rng, step)
        notes = []
        if plan.spawn:
            notes = await self.delegate(ctx, plan, task, rng, asks)
        if plan.long:
            await self.work_long(ctx)
        await self.report_usage(ctx, rng, self.config.steps)
        if plan.fail:
            message = f"simulated failure in {plan.path}: the tests would not pass"
            await ctx.emit(event("error", error=message))
            return Outcome(error=message)
        summary = f"Done with {task[:120]}" + (f" ({'; '.join(notes)})" if notes else "")
        await self.say(ctx, "Wrapping up.")
        await ctx.emit(event("result", summary))
        return Outcome(output=summary)

    async def report_usage(self, ctx: RunContext, rng: random.Random, turn: int) -> None:
        """A usage event per model turn, as agents report them (not one sum at the end, which
        is how budgets come to overshoot)."""
        usage = turn_usage(rng, turn)
        await ctx.emit(event("usage", usage_text(usage), input=usage))

    async def tool_step(self, ctx: RunContext, rng: random.Random, step: int) -> None:
        tool = rng.choice(TOOLS)
        call_id = f"t{step + 1}-{rng.randrange(16**6):06x}"
        target = f"src/module_{rng.randint(1, 40)}.py"
        await ctx.emit(
            event("tool-use", tool_name=tool, tool_call_id=call_id, input={"path": target})
        )
        await ctx.sleep(self.pace)
        if rng.random() < self.config.tool_fail_rate:
            await ctx.emit(
                event(
                    "tool-result",
                    tool_name=tool,
                    tool_call_id=call_id,
                    success=False,
                    error=f"{tool}: {target}: permission denied",
                )
            )
            await self.say(ctx, f"{tool} failed on {target}; trying another way.")
        else:
            await ctx.emit(
                event(
                    "tool-result",
                    tool_name=tool,
                    tool_call_id=call_id,
                    success=True,
                    tool_output={"lines": rng.randint(1, 400)},
                )
            )
            await self.say(ctx, f"{tool} on {target} looks fine.")
        await ctx.sleep(self.pace)

    def shows(self, plan: Plan, what: str, rate: float) -> bool:
        """Whether this run asks an approval / holds a lease. With a rate set, the demo's first
        root (path ``…-1``) always does, so a new user meets both at once."""
        if rate <= 0:
            return False
        return plan.path.endswith("-1") or self.rng(plan.path, what).random() < rate

    async def ask_step(self, ctx: RunContext, task: str, plan: Plan) -> None:
        """A shell command an operator must allow first: waits for the decision."""
        call_id = f"ask-{plan.path}"[-128:]
        asked = {
            "command": f"pytest -q tests/ -k '{plan.path}'",
            "description": f"Run the tests for: {task[:80]}",
        }
        await self.say(ctx, "I need to run the test suite; asking an operator first.")
        answer = await ctx.ask_approval(call_id, "Bash", asked, title=asked["description"])
        ctx.check_cancel()
        if answer.get("decision") != "allow":
            why = answer.get("message") or answer.get("decision", "no answer")
            await self.say(ctx, f"Not running it ({why}); carrying on without the tests.")
            return
        command = answer.get("updatedInput") or asked
        await ctx.emit(event("tool-use", tool_name="Bash", tool_call_id=call_id, input=command))
        await ctx.sleep(self.pace)
        await ctx.emit(
            event(
                "tool-result",
                tool_name="Bash",
                tool_call_id=call_id,
                success=True,
                tool_output={"command": command.get("command", ""), "passed": 12},
            )
        )
        await self.say(ctx, f"Allowed; ran {command.get('command', '')!r}: 12 passed.")

    def lease_for(self, plan: Plan) -> str | None:
        """The lease a delegating run starts its children under, kept after it ends."""
        if not self.shows(plan, "lease", self.config.lease_rate):
            return None
        return "lease-" + re.sub(r"[^A-Za-z0-9_.-]", "-", plan.path)[-100:]

    async def delegate(self, ctx: RunContext, plan: Plan, task: str, rng, asks=False) -> list[str]:
        call_id = f"delegate-{plan.path}"
        lease = self.lease_for(plan)
        await ctx.emit(
            event(
                "tool-use",
                tool_name="delegate",
                tool_call_id=call_id,
                input={"subtasks": plan.spawn},
            )
        )
        children: dict[str, str] = {}  # childId -> subtask path
        notes = []
        for index in range(plan.spawn):
            sub = self.child_plan(plan, index, ctx.depth + 1)
            topic = self.rng(sub.path, "topic").choice(TOPICS)
            request = {
                "requestId": f"{ctx.run_id}-sub-{index + 1}"[-128:],
                "profile": "worker",
                "message": f"Subtask {sub.path} of '{task[:80]}': {topic}\n\n{sub.render()}",
            }
            try:
                if lease:
                    request["leaseId"] = lease
                    child = await ctx.client.child_start(
                        ctx.run_id,
                        ctx.host.extension_id,
                        ctx.host.generation,
                        request,
                        tool_call_id=call_id,
                        lease_id=lease,
                    )
                else:
                    child = await ctx.child_start(request, tool_call_id=call_id)
            except DepthLimitReached as refused:
                await self.say(
                    ctx,
                    f"Delegation refused: {refused.message}. Finishing subtask {sub.path} myself.",
                )
                await self.tool_step(ctx, rng, 100 + index)
                notes.append(f"{sub.path} done myself (depth limit)")
                break  # every further spawn from this level would be refused too
            except AdmissionRefused as refused:
                await self.say(ctx, f"Admission refused ({refused.message}); doing it myself.")
                await self.tool_step(ctx, rng, 100 + index)
                notes.append(f"{sub.path} done myself (admission)")
                continue
            children[child.child_id] = sub.path
            held = f" under lease {lease}" if lease else ""
            await self.say(ctx, f"Delegated {sub.path} to child {child.child_id}{held}.")
        if asks:
            await self.ask_step(ctx, task, plan)
        results = await self.wait_children(ctx, children, lease)
        ok = all(not r.error and not r.cancelled for r in results.values())
        for child_id, result in results.items():
            state = result.status or ("failed" if result.error else "done")
            notes.append(f"{children[child_id]} {state}")
            await self.say(
                ctx,
                f"Child {children[child_id]} finished ({state}): "
                f"{(result.output or result.error)[:200]}",
            )
        await ctx.emit(
            event(
                "tool-result",
                tool_name="delegate",
                tool_call_id=call_id,
                success=ok,
                tool_output={children[c]: r.status for c, r in results.items()},
            )
        )
        with_children = bool(children)
        if with_children:
            await ctx.client.tool_end(ctx.run_id, call_id)
        return notes

    async def wait_children(self, ctx: RunContext, children: dict[str, str], lease=None):
        after = dict.fromkeys(children, 0)
        results = {}
        while len(results) < len(children):
            for child_id in children:
                if child_id in results:
                    continue
                if lease:
                    read = await ctx.client.child_read(
                        ctx.run_id,
                        ctx.host.extension_id,
                        ctx.host.generation,
                        child_id,
                        after=after[child_id],
                        lease_id=lease,
                    )
                else:
                    read = await ctx.child_read(child_id, after=after[child_id])
                if read.events:
                    after[child_id] = read.last_sequence
                if read.done:
                    results[child_id] = read
            if len(results) < len(children):
                await ctx.sleep(max(self.config.poll, 0.05))
        return results

    async def work_long(self, ctx: RunContext) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.long_seconds
        await self.say(ctx, f"This will take a while (about {int(self.config.long_seconds)}s).")
        tick = 0
        while loop.time() < deadline:
            tick += 1
            await ctx.sleep(1.0)
            if tick % 3 == 0 or not ctx.steers.empty():
                left = max(0, int(deadline - loop.time()))
                await self.say(ctx, f"Still working (about {left}s left).")
