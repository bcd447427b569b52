"""Command line of the reference runner (``python manage.py runner`` or ``python -m
delegation.runner``; both take the same flags)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import sys

from delegation import depth as depthlib
from delegation.client import AuthenticationFailed, ClientError, Fenced, server_urls
from delegation.logfilters import OrdinaryEvents
from delegation.runner.command import CommandEngine
from delegation.runner.host import RunnerHost
from delegation.runner.kodelet.engine import host_extensions
from delegation.runner.presets import load_config
from delegation.runner.scripted import ScriptedConfig, ScriptedEngine

log = logging.getLogger("canopy.runner")

DEFAULT_URL = "ws://127.0.0.1:8000/ws/runner/"
TOKEN_ENV = "CANOPY_RUNNER_TOKEN"


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    # One add_argument per documented flag (docs/reference/runner-cli.md): a flat list.
    parser = parser or argparse.ArgumentParser(prog="runner", description="Canopy reference runner")
    parser.add_argument(
        "--url",
        action="append",
        default=None,
        help="runner WebSocket URL; repeat it or separate URLs with commas to fail over "
        f"between servers (env CANOPY_URL, commas too; default {DEFAULT_URL})",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="runner token (prefer env CANOPY_RUNNER_TOKEN or --token-file: argv is visible "
        "to other users of the machine)",
    )
    parser.add_argument(
        "--token-file",
        default=None,
        help="read the runner token from a file only its owner can read (mode 600)",
    )
    parser.add_argument("--token-fd", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--engine", choices=("scripted", "command", "acp"), default="scripted")
    parser.add_argument("--config", default=None, help="presets JSON file (command, acp)")
    parser.add_argument(
        "--workspace",
        default=None,
        help="directory children run in (command engine; default: the config's, else cwd)",
    )
    parser.add_argument("--extension-id", default=None, help="default: reference-runner")
    parser.add_argument("--generation", type=int, default=None, help="default: start time, ms")
    parser.add_argument("--host-instance-id", default=None, help="default: hostname-pid")
    parser.add_argument(
        "--depth",
        default=None,
        help="level this runner declares on the handshake (default: env "
        f"{depthlib.ENV_VAR}; invalid means undeclared)",
    )
    parser.add_argument("--connect-timeout", type=float, default=120.0)
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))

    scripted = parser.add_argument_group("scripted engine")
    scripted.add_argument("--seed", type=int, default=1)
    scripted.add_argument("--pace", type=float, default=None, help="seconds between steps")
    scripted.add_argument("--steps", type=int, default=None, help="tool steps per run")
    scripted.add_argument("--fanout", type=int, default=None, help="children per delegation")
    scripted.add_argument(
        "--levels",
        type=int,
        default=None,
        help="deepest level runs try to create (default MaxDepth+1: the deepest branch is "
        "refused at the cap)",
    )
    scripted.add_argument(
        "--max-depth",
        type=int,
        default=None,
        help="the server's MaxDepth (default env DELEGATION_MAX_DEPTH or 3)",
    )
    scripted.add_argument("--shape", choices=("full", "sparse"), default=None)
    scripted.add_argument("--fail-rate", type=float, default=None)
    scripted.add_argument("--tool-fail-rate", type=float, default=None)
    scripted.add_argument("--long-rate", type=float, default=None)
    scripted.add_argument("--long-seconds", type=float, default=None)
    scripted.add_argument(
        "--approval-rate", type=float, default=None, help="share of runs that ask an operator"
    )
    scripted.add_argument(
        "--lease-rate",
        type=float,
        default=None,
        help="share of delegating runs that start their children under a lease they keep",
    )

    roots = parser.add_argument_group("top-level runs")
    roots.add_argument(
        "--root",
        action="append",
        default=[],
        metavar="MESSAGE",
        help="open a top-level run with this task at start (repeatable)",
    )
    roots.add_argument(
        "--root-profile",
        default=None,
        help="preset the --root runs use (default: the engine's first preset)",
    )
    roots.add_argument(
        "--root-budget",
        type=_budget_arg,
        default=None,
        metavar="JSON",
        help='budget of each --root run\'s tree, e.g. \'{"maxCostUsd": 0.5, "maxRuns": 20}\' '
        "(maxRuns, maxLive, maxTokens, maxCostUsd, maxSeconds)",
    )
    roots.add_argument(
        "--demo-budget-every",
        type=int,
        default=3,
        help="scripted demo: every Nth root gets a small cost budget that stops it (0: none)",
    )
    roots.add_argument("--once", action="store_true", help="exit when the --root runs are done")
    roots.add_argument(
        "--demo",
        action="store_true",
        help="scripted demo: a new root every --demo-interval seconds, sparse trees, some "
        "long-running or failing children, one branch refused at the cap",
    )
    roots.add_argument("--demo-interval", type=float, default=5.0)
    roots.add_argument("--demo-max-live", type=int, default=6, help="roots running at once")
    roots.add_argument(
        "--demo-roots",
        type=int,
        default=0,
        help="open N demo roots, then exit once no run is live on this runner (0: never)",
    )
    return parser


def read_token(args) -> str:
    if getattr(args, "token_fd", None) is not None:
        return _read_fd(args.token_fd)
    if args.token:
        return args.token.strip()
    if args.token_file:
        return read_token_file(args.token_file)
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise SystemExit("runner: no token (use --token-file, --token or CANOPY_RUNNER_TOKEN)")
    return token


def read_token_file(path: str) -> str:
    try:
        mode = os.stat(path).st_mode
        if mode & 0o077:
            raise SystemExit(
                f"runner: --token-file {path} is readable by others (mode {mode & 0o777:o}); "
                f"chmod 600 it"
            )
        with open(path, encoding="utf-8") as fh:
            token = fh.read().strip()
    except OSError as exc:
        raise SystemExit(f"runner: cannot read --token-file {path}: {exc.strerror}") from None
    if not token:
        raise SystemExit(f"runner: --token-file {path} is empty")
    return token


def _read_fd(fd: int) -> str:
    chunks = []
    with contextlib.suppress(OSError):
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    with contextlib.suppress(OSError):
        os.close(fd)
    return b"".join(chunks).decode("utf-8", errors="replace").strip()


def hide_token(argv: list[str]) -> None:
    """Re-exec this process with the token in neither its environment nor its arguments.

    ``/proc/<pid>/environ`` and ``cmdline`` keep what the process was started with whatever
    it deletes later, and an agent running as the same user can read both: a token given in
    ``CANOPY_RUNNER_TOKEN`` or ``--token`` moves into a pipe the new image reads once
    (``--token-fd``). ``argv`` is the whole command line, interpreter included
    (``sys.orig_argv``). Returns only when there is nothing to hide.
    """
    if "--token-fd" in argv:
        return
    token = os.environ.get(TOKEN_ENV, "").strip()
    given_file = any(a == "--token-file" or a.startswith("--token-file=") for a in argv)
    kept: list[str] = []
    skip = False
    flagged = None
    for arg in argv:
        if skip:
            flagged, skip = arg, False
        elif arg == "--token":
            skip = True
        elif arg.startswith("--token="):
            flagged = arg.split("=", 1)[1]
        else:
            kept.append(arg)
    if flagged is not None:
        token = flagged.strip()
    elif given_file:
        token = ""  # the file wins; the environment copy is only dropped
    if TOKEN_ENV not in os.environ and flagged is None:
        return
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    if token:
        read_end, write_end = os.pipe()
        os.write(write_end, token.encode("utf-8"))
        os.close(write_end)
        os.set_inheritable(read_end, True)
        kept += ["--token-fd", str(read_end)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, kept, env)


def build_engine(args):
    if args.engine == "command":
        if not args.config:
            raise SystemExit("runner: --engine command needs --config presets.json")
        config = load_config(args.config)
        engine = CommandEngine.from_config(config, workspace=args.workspace)
        return host_extensions(engine), engine.workspace, config.get("extensionId")
    if args.engine == "acp":
        if not args.config:
            raise SystemExit("runner: --engine acp needs --config presets.json")
        # Imported here: the ACP package takes seconds to import and only this engine needs it.
        from delegation.runner.acp import AcpEngine

        config = load_config(args.config)
        engine = AcpEngine.from_config(config, workspace=args.workspace)
        return host_extensions(engine), engine.workspace, config.get("extensionId")
    max_depth = args.max_depth
    if max_depth is None:
        max_depth = depthlib.parse(os.environ.get("DELEGATION_MAX_DEPTH", "3")) or 3
    cfg = ScriptedConfig(seed=args.seed, depth=max_depth + 1)
    if args.demo:
        cfg.shape, cfg.fanout, cfg.pace = "sparse", 3, 0.8
        cfg.fail_rate, cfg.long_rate, cfg.long_seconds = 0.2, 0.3, 45.0
        # Issue 38: the demo shows an approval waiting in the inbox and a lease to release.
        cfg.approval_rate, cfg.lease_rate = 0.15, 0.3
    for name, attr in (
        ("pace", "pace"),
        ("steps", "steps"),
        ("fanout", "fanout"),
        ("levels", "depth"),
        ("shape", "shape"),
        ("fail_rate", "fail_rate"),
        ("tool_fail_rate", "tool_fail_rate"),
        ("long_rate", "long_rate"),
        ("long_seconds", "long_seconds"),
        ("approval_rate", "approval_rate"),
        ("lease_rate", "lease_rate"),
    ):
        value = getattr(args, name)
        if value is not None:
            setattr(cfg, attr, value)
    return ScriptedEngine(cfg), args.workspace, None


PR_SET_DUMPABLE = 4


def not_dumpable() -> bool:
    """Make this process undumpable: no process of its account may then read its memory
    (``/proc/<pid>/mem``, ptrace) or environment, where the runner token lives, whatever an
    agent's sandbox. Cleared again by an ``execve``, so called in the runner's final image."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0:
            return True
        log.warning("prctl(PR_SET_DUMPABLE, 0) failed: %s", os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        log.warning("prctl(PR_SET_DUMPABLE, 0) unavailable: %s", exc)
    return False


async def run(args) -> int:
    # The runner's start in order (not dumpable, token, engine, client, signals, serve).
    not_dumpable()
    token = read_token(args)
    engine, workspace, config_extension = build_engine(args)
    depth = None
    if args.depth is not None:
        depth = depthlib.parse(args.depth)
    args.url = server_urls(args.url or os.environ.get("CANOPY_URL") or DEFAULT_URL)
    host = RunnerHost(
        args.url,
        token,
        engine,
        extension_id=args.extension_id or config_extension or "reference-runner",
        generation=args.generation,
        host_instance_id=args.host_instance_id,
        workspace=os.path.abspath(workspace) if workspace else None,
        depth=depth,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, _on_signal, stop, loop)
    try:
        registration = await host.start(timeout=args.connect_timeout)
    except AuthenticationFailed as exc:
        log.error("%s: check the token (python manage.py runner_token create NAME)", exc)
        return 2
    except ClientError as exc:
        log.error("cannot register with %s: %s", ", ".join(args.url), exc)
        return 1
    log.info(
        "runner %s connected to %s (engine %s, extension %s generation %s)",
        registration.runner_id,
        host.client.url,
        engine.name,
        host.extension_id,
        host.generation,
    )
    roots = []
    for message in args.root:
        roots.append(
            await host.open_root(message, profile=args.root_profile, budget=args.root_budget)
        )
    work = []
    if args.demo:
        if engine.name != "scripted":
            log.error("--demo needs the scripted engine")
            return 2
        work.append(asyncio.create_task(demo(host, engine, args)))
    if args.once:
        work.append(asyncio.create_task(_wait_roots(host, roots)))
    stopper = asyncio.create_task(stop.wait())
    fatal = asyncio.create_task(_watch_fatal(host))
    done, _ = await asyncio.wait([stopper, fatal, *work], return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if fatal in done and fatal.result() is not None:
        log.error("stopping: %s", fatal.result())
        code = 3
    for task in (stopper, fatal, *work):
        task.cancel()
    log.info("stopping: cancelling running executions")
    await host.stop()
    return code


def _on_signal(stop: asyncio.Event, loop) -> None:
    if stop.is_set():
        os._exit(130)  # a second Ctrl-C: leave now
    stop.set()


async def _watch_fatal(host: RunnerHost):
    while True:
        fatal = host.client._fatal
        if isinstance(fatal, AuthenticationFailed | Fenced):
            return fatal
        await asyncio.sleep(0.5)


async def _wait_roots(host: RunnerHost, roots) -> None:
    for ctx in roots:
        await host.wait(ctx.run_id)


DEMO_BUDGET_USD = 0.15


def _budget_arg(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


async def demo(host: RunnerHost, engine: ScriptedEngine, args) -> None:
    """Keep a live forest growing: a new root every interval, a few alive at once."""
    live: list[str] = []
    opened = 0
    while not args.demo_roots or opened < args.demo_roots:
        live = [run_id for run_id in live if run_id in host.runs]
        if len(live) < max(1, args.demo_max_live):
            opened += 1
            path = f"{host.generation % 100000}-{opened}"
            # Some demo trees run under a budget too small for them, so the dashboard shows a
            # budget stopping a tree, with its reason.
            every = getattr(args, "demo_budget_every", 0)
            budget = {"maxCostUsd": DEMO_BUDGET_USD} if every and opened % every == 0 else None
            try:
                ctx = await host.open_root(
                    engine.root_message(path), profile="planner", budget=budget
                )
            except ClientError as exc:
                log.warning("could not open a demo root: %s", exc)
            else:
                live.append(ctx.run_id)
                log.info("demo: opened root %s (%s)", ctx.run_id, path)
        await asyncio.sleep(args.demo_interval)
    # Done opening demo roots, not done serving: runs operators launched on this runner (and
    # every child) keep it up; returning while one lives would stop the runner and cancel them.
    while host.runs:
        await asyncio.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the real command line, not a call from Python
        hide_token(list(sys.orig_argv))
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    return asyncio.run(run(args))


def configure_logging(level: str) -> None:
    """The runner's own loggers at ``level``, whether or not Django configured logging."""
    level = getattr(logging, str(level).upper(), logging.INFO)
    canopy = logging.getLogger("canopy")
    canopy.setLevel(level)
    if not canopy.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.addFilter(OrdinaryEvents())  # a child torn down after its cancel: one line
        canopy.addHandler(handler)
        canopy.propagate = False  # not twice through a root handler Django may have set up
    logging.getLogger("websockets").setLevel(logging.WARNING)
