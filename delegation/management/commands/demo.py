"""``python manage.py demo``: the one-command live demo behind ``make run``.

It creates (or updates) the admin account ``demo`` with a fresh random password, shown once,
rotates the token of the runner ``demo-runner``, then starts daphne and the scripted reference
runner in demo mode (a new root every few seconds, fan-out up to 3, one branch refused at
MaxDepth, some long-running and some failing children) and supervises both. Ctrl-C (or
SIGTERM) stops the runner first, so its running executions are reported cancelled while the
server is still up, then the server.

``--presets FILE`` runs the reference runner's ``command`` engine (``--engine acp`` for ACP
agents) on that presets file instead of the scripted demo, e.g. the README's real-agent presets;
``--root MESSAGE`` (with ``--root-profile``) opens a top-level run with it at start.

``--model-stub PORT`` also starts the scripted model endpoint (``delegation.runner.demo_model``,
its own process on 127.0.0.1:PORT) and supervises it with the others: ``make demo-agents`` runs
real Claude Code on it, offline, from ``deploy/presets/demo-claude.json``.

``--lease-runner`` also runs a second, scripted runner (``demo-leases``) whose one root starts
two children under a lease it keeps after it ends: real Claude Code delegates through the MCP
``delegate`` tool, which holds no lease, so ``make demo-agents`` shows a lease to release this
way (issue 38).

``--no-serve`` only prepares the account and the token (``--print-token`` prints the token
alone on the last line, for scripts that start the processes themselves).
"""

from __future__ import annotations

import io
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from canopy.serving import ServerDidNotStart, answers, reachable_host, start_server, stop_server
from delegation import roles
from delegation.services import tokens

BASE_DIR = Path(settings.BASE_DIR)
RUNNER_NAME = "demo-runner"
LEASE_RUNNER_NAME = "demo-leases"
LEASE_ROOT = "[lease] Keep two workers on call"
# The server's own secrets: the demo runner is started without them.
SERVER_SECRETS = (
    "SECRET_KEY",
    "DATABASE_URL",
    "REDIS_URL",
    "CANOPY_RUNNER_TOKEN",
    "CANOPY_PASSWORD",
)


class Command(BaseCommand):
    help = "Create the demo operator and runner token, then serve with a scripted demo runner."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--username", default="demo")
        parser.add_argument("--interval", type=float, default=5.0, help="seconds between roots")
        parser.add_argument("--max-live", type=int, default=6, help="roots growing at once")
        parser.add_argument("--seed", type=int, default=None, help="default: random")
        parser.add_argument("--no-serve", action="store_true", help="prepare only, then exit")
        parser.add_argument("--print-token", action="store_true")
        parser.add_argument(
            "--presets", default=None, help="run real agents from this presets file instead"
        )
        parser.add_argument("--engine", choices=("command", "acp"), default="command")
        parser.add_argument("--root", action="append", default=[], metavar="MESSAGE")
        parser.add_argument("--root-profile", default=None)
        parser.add_argument(
            "--workspace",
            default=None,
            help="the agents' workspace (with --presets; never the checkout: SPEC §13)",
        )
        parser.add_argument(
            "--model-stub", type=int, default=None, metavar="PORT", help="scripted model port"
        )
        parser.add_argument(
            "--lease-runner",
            action="store_true",
            help=f"also run the scripted runner {LEASE_RUNNER_NAME}, which holds one lease",
        )

    def handle(self, *args, **opts):
        password = secrets.token_urlsafe(12)
        call_command(
            "create_operator",
            opts["username"],
            "--role",
            # Admin: the demo shows every page (alerts and webhooks are admin-only).
            roles.ADMIN,
            f"--password={password}",  # one token: a password may start with "-"
            stdout=io.StringIO(),  # quiet: the password is printed below, once
        )
        _runner, token = tokens.create_runner(RUNNER_NAME)
        lease_token = None
        if opts.get("lease_runner"):
            _runner, lease_token = tokens.create_runner(LEASE_RUNNER_NAME)
        base = f"http://{reachable_host(opts['host'])}:{opts['port']}"

        def welcome():
            self.stdout.write("")
            self.stdout.write(self.style.SUCCESS("Canopy demo"))
            self.stdout.write(f"  dashboard : {base}/")
            self.stdout.write(f"  admin     : {base}/admin/")
            self.stdout.write(f"  user      : {opts['username']} (role admin)")
            self.stdout.write(f"  password  : {password}   (shown once; rerun to get a new one)")
            self.stdout.write(f"  runner    : {RUNNER_NAME} (token rotated)")
            if lease_token:
                self.stdout.write(f"  runner    : {LEASE_RUNNER_NAME} (scripted; holds a lease)")
            self.stdout.write("")

        if opts["no_serve"]:
            welcome()
            if opts["print_token"]:
                self.stdout.write(token)
            return
        # Printed once the server answers, after everything the install and the server's
        # start printed (issue 38: 388 lines of install output scrolled the password away).
        code = self.serve(token, opts, welcome, lease_token=lease_token)
        if code:
            raise SystemExit(code)

    # -- processes -----------------------------------------------------------------------

    def serve(self, token: str, opts, welcome, *, lease_token: str | None = None) -> int:
        # Server and demo runner started, watched and stopped together, in that order.
        host, port = opts["host"], opts["port"]
        if answers(host, port):
            self.stderr.write(f"Port {port} is already in use; stop that server or pass --port.")
            return 1
        seed = opts["seed"] if opts["seed"] is not None else secrets.randbelow(10**6)
        runner_cmd = runner_command(opts, seed)
        env = dict(os.environ)
        env.pop("PANDO_DELEGATION_DEPTH", None)  # demo roots are top-level
        # The runner's environment and argv stay token-free (any process of this user reads
        # /proc/<pid>/environ and cmdline): the token goes through a pipe it reads once.
        runner_env = {k: v for k, v in env.items() if k not in SERVER_SECRETS}
        token_fd, write_end = os.pipe()
        os.write(write_end, token.encode("utf-8"))
        os.close(write_end)
        runner_cmd += ["--token-fd", str(token_fd)]
        stop = {"signal": None}

        def on_signal(signum, _frame):
            stop["signal"] = signum

        # SIGHUP too: a closed terminal must not orphan the two processes in their own sessions.
        stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {sig: signal.signal(sig, on_signal) for sig in stop_signals}
        # Own sessions: a terminal Ctrl-C reaches only this supervisor, which then stops the
        # runner before the server, so running executions end as cancelled, not lost.
        server = runner = model = leases = None
        try:
            if opts.get("model_stub") is not None:
                model = self.start_model(opts["model_stub"], runner_env)
                if model is None:
                    return 1
            try:
                server = start_server(host, port, env=env, own_session=True)
            except ServerDidNotStart as failure:
                self.stderr.write(f"The server did not start ({failure}); see its output above.")
                return 1
            runner = subprocess.Popen(
                runner_cmd,
                cwd=BASE_DIR,
                env=runner_env,
                start_new_session=True,
                pass_fds=(token_fd,),
            )
            os.close(token_fd)
            token_fd = None
            if lease_token:
                leases = start_with_token(lease_runner_command(opts), lease_token, runner_env)
            what = (
                f"the {opts['engine']} runner on {opts['presets']}"
                if opts["presets"]
                else (f"the demo runner (seed {seed})")
            )
            self.stdout.write(f"Serving on {host}:{port} with {what}. Ctrl-C stops both.")
            welcome()
            while stop["signal"] is None:
                if server.poll() is not None:
                    self.stderr.write(f"The server exited ({server.returncode}).")
                    return 1
                if runner.poll() is not None:
                    self.stderr.write(f"The demo runner exited ({runner.returncode}).")
                    return 1
                if leases is not None and leases.poll() is not None:
                    self.stderr.write(f"The lease runner exited ({leases.returncode}).")
                    return 1
                if model is not None and model.poll() is not None:
                    self.stderr.write(f"The scripted model exited ({model.returncode}).")
                    return 1
                time.sleep(0.2)
            self.stdout.write("\nStopping the demo runner, then the server...")
            return 0
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if token_fd is not None:
                os.close(token_fd)
            stop_server(leases)
            stop_server(runner)
            stop_server(server)
            stop_server(model)

    def start_model(self, port: int, env: dict) -> subprocess.Popen | None:
        # Its own loopback process, never part of the server: it answers as a model would.
        if answers("127.0.0.1", port):
            self.stderr.write(f"Port {port} (scripted model) is already in use; pass another.")
            return None
        cmd = [sys.executable, "-m", "delegation.runner.demo_model", "--port", str(port)]
        model = subprocess.Popen(cmd, cwd=BASE_DIR, env=env, start_new_session=True)
        deadline = time.monotonic() + 15
        while not answers("127.0.0.1", port):
            if model.poll() is not None or time.monotonic() > deadline:
                self.stderr.write("The scripted model did not start; see its output above.")
                stop_server(model)
                return None
            time.sleep(0.1)
        return model


def start_with_token(cmd: list[str], token: str, env: dict) -> subprocess.Popen:
    """A runner process reading its token from a pipe (never its argv or environment)."""
    read_end, write_end = os.pipe()
    os.write(write_end, token.encode("utf-8"))
    os.close(write_end)
    try:
        return subprocess.Popen(
            [*cmd, "--token-fd", str(read_end)],
            cwd=BASE_DIR,
            env=env,
            start_new_session=True,
            pass_fds=(read_end,),
        )
    finally:
        os.close(read_end)


def lease_runner_command(opts) -> list[str]:
    """One scripted root whose two children run under a lease it keeps after it ends."""
    host, port = opts["host"], opts["port"]
    return [
        sys.executable,
        "-m",
        "delegation.runner",
        "--url",
        f"ws://{reachable_host(host)}:{port}/ws/runner/",
        "--host-instance-id",
        f"demo-leases-{socket.gethostname()}-{os.getpid()}"[:128],
        "--engine",
        "scripted",
        "--extension-id",
        "demo-leases",
        f"--root={LEASE_ROOT}",
        "--levels",
        "1",
        "--fanout",
        "2",
        "--steps",
        "1",
        "--pace",
        "0.3",
        "--fail-rate",
        "0",
        "--long-rate",
        "0",
        "--approval-rate",
        "0",
        "--lease-rate",
        "1",
    ]


def runner_command(opts, seed: int) -> list[str]:
    """The runner's command line: the scripted demo, or real agents from a presets file."""
    host, port = opts["host"], opts["port"]
    # Django-free (python -m): the runner needs none of the server's settings or secrets.
    cmd = [
        sys.executable,
        "-m",
        "delegation.runner",
        "--url",
        f"ws://{reachable_host(host)}:{port}/ws/runner/",
        "--host-instance-id",
        f"demo-{socket.gethostname()}-{os.getpid()}"[:128],
    ]
    if opts.get("presets"):
        cmd += ["--engine", opts.get("engine") or "command"]
        cmd += ["--config", os.path.abspath(opts["presets"])]
        if opts.get("workspace"):
            os.makedirs(opts["workspace"], exist_ok=True)
            cmd += ["--workspace", os.path.abspath(opts["workspace"])]
        for message in opts.get("root") or []:
            cmd.append(f"--root={message}")  # one token: a message may start with "-"
        if opts.get("root_profile"):
            cmd += ["--root-profile", opts["root_profile"]]
        return cmd
    return cmd + [
        "--engine",
        "scripted",
        "--demo",
        "--demo-interval",
        str(opts["interval"]),
        "--demo-max-live",
        str(opts["max_live"]),
        "--max-depth",
        str(settings.DELEGATION_MAX_DEPTH),
        "--extension-id",
        "demo",
        "--seed",
        str(seed),
    ]
