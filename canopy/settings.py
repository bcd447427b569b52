"""One settings file, driven by the environment.

Every knob the SPEC names is read from an environment variable of the same name through a
validating helper, so a typo such as ``DELEGATION_MAX_DEPTH=three`` stops the process at start
with a message naming the variable instead of surfacing later as a wrong cap.
"""

import os
import sys
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name, default=""):
    return os.environ.get(name, default)


def env_int(name, default, minimum=None):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {value}")
    return value


def env_float(name, default, minimum=None):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {value}")
    return value


def env_bool(name, default):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false), got {raw!r}")


def env_list(name, default):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def secret_from_file(name: str) -> str | None:
    """The secret in the file ``name`` (a ``*_FILE`` variable) names, or None if unset: a key in
    a file is in no process's environment (``/proc/<pid>/environ``). The file must be readable
    by its owner only."""
    path = os.environ.get(name, "").strip()
    if not path:
        return None
    try:
        mode = os.stat(path).st_mode
        with open(path, encoding="utf-8") as fh:
            value = fh.read().strip()
    except OSError as exc:
        raise ImproperlyConfigured(f"{name}: cannot read {path}: {exc.strerror}") from None
    if mode & 0o077:
        raise ImproperlyConfigured(
            f"{name}: {path} is readable by others (mode {mode & 0o777:o}); chmod 600 it"
        )
    if not value:
        raise ImproperlyConfigured(f"{name}: {path} is empty")
    return value


# `manage.py runner` is a client of the server that signs nothing: a runner machine needs no
# server key (and should not hold one).
_RUNNER_ONLY = sys.argv[1:2] == ["runner"]
if not _RUNNER_ONLY:
    # Everything the server writes (the SQLite database and its WAL, the data directory, the
    # static root, logs) is its owner's alone; a runner keeps the operator's umask for agents.
    os.umask(os.umask(0o077) | 0o077)

DEBUG = env_bool("DEBUG", False)
DEVELOPMENT_SECRET_KEY = "canopy-insecure-development-key-change-me"
_KEY_FROM_FILE = secret_from_file("SECRET_KEY_FILE")
# The checkout's own development key (`make run` / `make serve` make it once, owner-only):
# found without an environment variable, so `python manage.py ...` works as pasted from the
# README in a checkout that has served once. Any SECRET_KEY or SECRET_KEY_FILE wins; a wheel
# install has no such file.
CHECKOUT_KEY_FILE = BASE_DIR / "var" / "dev-secret-key"
if _KEY_FROM_FILE is None and "SECRET_KEY" not in os.environ and CHECKOUT_KEY_FILE.is_file():
    os.environ["SECRET_KEY_FILE"] = str(CHECKOUT_KEY_FILE)  # servers and runners it starts too
    _KEY_FROM_FILE = secret_from_file("SECRET_KEY_FILE")
if _KEY_FROM_FILE is not None and os.environ.get("SECRET_KEY"):
    raise ImproperlyConfigured("set SECRET_KEY or SECRET_KEY_FILE, not both")
SECRET_KEY = _KEY_FROM_FILE or env_str("SECRET_KEY", DEVELOPMENT_SECRET_KEY)
# Anyone who knows the key forges session cookies: outside DEBUG, a known or short key is a
# start-up error, not a silent default.
if (
    not DEBUG
    and not _RUNNER_ONLY
    and (SECRET_KEY == DEVELOPMENT_SECRET_KEY or len(SECRET_KEY) < 50)
):
    _got = (
        "the development default"
        if SECRET_KEY == DEVELOPMENT_SECRET_KEY
        else f"{len(SECRET_KEY)} characters"
    )
    raise ImproperlyConfigured(
        f"SECRET_KEY must be a random value of at least 50 characters when DEBUG is off (got "
        f"{_got}); generate one with python -c 'import secrets; print(secrets.token_urlsafe(50))'"
        " (in SECRET_KEY, or a file named by SECRET_KEY_FILE), or set DEBUG=true for development"
    )
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    # Before the admin: its templates (dashboard/templates/admin/base_site.html) restyle the
    # admin's own, and an app's templates override those of the apps listed after it.
    "dashboard",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "ninja",
    "axes",
    "delegation",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # A user of the identity provider: its groups re-read every OIDC_RECHECK_SECONDS.
    "dashboard.sso.RecheckMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "dashboard.security.ContentSecurityPolicyMiddleware",
    # Last, as django-axes requires: it turns a locked-out sign-in into its 429 page.
    "axes.middleware.AxesMiddleware",
]

AUTHENTICATION_BACKENDS = [
    "dashboard.security.SignInThrottle",
    "django.contrib.auth.backends.ModelBackend",
]

ROOT_URLCONF = "canopy.urls"
ASGI_APPLICATION = "canopy.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # Templates live inside their apps (dashboard/templates, delegation/templates), so an
        # installed wheel carries them as package data.
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Storage -------------------------------------------------------------------------------

# A checkout keeps its data in var/; an installed package (no manage.py beside it) in the
# user's data directory, never inside site-packages.
if (BASE_DIR / "manage.py").exists():
    _DEFAULT_DATA_DIR = BASE_DIR / "var"
else:
    _xdg = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
    _DEFAULT_DATA_DIR = Path(_xdg) / "canopy"
DATA_DIR = Path(env_str("CANOPY_DATA_DIR", str(_DEFAULT_DATA_DIR)))
DATABASE_URL = env_str("DATABASE_URL", "")

if DATABASE_URL:
    _default = dj_database_url.parse(
        DATABASE_URL,
        conn_max_age=env_int("CONN_MAX_AGE", 60, minimum=0),
        conn_health_checks=True,
    )
else:
    _default = {"ENGINE": "django.db.backends.sqlite3", "NAME": DATA_DIR / "canopy.sqlite3"}


def private_data_dir(path: Path) -> None:
    """The data directory 0700 and the SQLite files in it 0600, whatever made them before: they
    hold every session key, and a readable ``django_session`` signs anyone in."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_uid != os.geteuid():
        return  # another account's directory: not this process's to change
    path.chmod(0o700)
    for entry in path.glob("*.sqlite3*"):
        if entry.is_file() and entry.stat().st_uid == os.geteuid():
            entry.chmod(0o600)


if not DATABASE_URL and not _RUNNER_ONLY:
    private_data_dir(DATA_DIR)

if _default["ENGINE"] == "django.db.backends.sqlite3":
    _default["OPTIONS"] = {
        # WAL lets readers (dashboard, REST) proceed while a runner appends events;
        # IMMEDIATE transactions take the write lock up front, so two writers queue on
        # busy_timeout instead of failing with "database is locked" on upgrade.
        "init_command": "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL;PRAGMA busy_timeout=20000;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    }
    # A file database for tests too: live-server and browser tests share it across threads
    # and processes, which an in-memory SQLite database cannot do.
    _default["TEST"] = {
        "NAME": env_str("TEST_DATABASE_NAME", "")
        or str(DATA_DIR / f"canopy-test-{os.getpid()}.sqlite3")
    }
elif _default["ENGINE"] == "django.db.backends.postgresql":
    # An explicit test database name lets a live-server process and the suite agree on it.
    _default["TEST"] = {"NAME": env_str("TEST_DATABASE_NAME", "canopy_test")}

DATABASES = {"default": _default}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "")
# SPEC §13: channel-layer messages are Fernet-encrypted with a key of their own, so a message
# anyone else writes into Redis is dropped unread. Comma-separated: the first encrypts, every
# one decrypts (rotation). `check --deploy` warns when Redis is used without one.
CHANNEL_LAYER_KEYS = env_list("CHANNEL_LAYER_KEY", [])
for _key in CHANNEL_LAYER_KEYS:
    if len(_key) < 32:
        raise ImproperlyConfigured(
            f"CHANNEL_LAYER_KEY: each key must be at least 32 characters (got {len(_key)}); "
            "generate one with python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
_LAYER_CRYPTO = {"symmetric_encryption_keys": CHANNEL_LAYER_KEYS}
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # Survives Redis outages: doorbells are lost, sockets are not (delegation/layers.py).
            "BACKEND": "delegation.layers.ResilientRedisChannelLayer",
            "CONFIG": {
                "hosts": [REDIS_URL],
                # Live delivery is a doorbell: a dropped message only delays a client until
                # its next catch-up from the database, so a generous capacity is enough.
                "capacity": env_int("CHANNEL_CAPACITY", 1000, minimum=10),
                "expiry": 30,
                **(_LAYER_CRYPTO if CHANNEL_LAYER_KEYS else {}),
            },
        }
    }
    # The bench's comparison (issue 26): channels-redis's pub/sub layer, which fans out per
    # process by itself but keeps no capacity and does not outlive a Redis outage as ours does.
    if env_str("REDIS_CHANNEL_LAYER", "core") == "pubsub":
        CHANNEL_LAYERS["default"] = {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], **(_LAYER_CRYPTO if CHANNEL_LAYER_KEYS else {})},
        }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels.layers.InMemoryChannelLayer",
            "CONFIG": {"capacity": env_int("CHANNEL_CAPACITY", 1000, minimum=10)},
        }
    }

# --- Delegation rules (SPEC §3-§6) ----------------------------------------------------------

DELEGATION_MAX_DEPTH = env_int("DELEGATION_MAX_DEPTH", 3, minimum=0)
DELEGATION_MAX_CONCURRENT = env_int("DELEGATION_MAX_CONCURRENT", 8, minimum=1)
DELEGATION_MAX_CHILDREN = env_int("DELEGATION_MAX_CHILDREN", 64, minimum=1)
LEASE_TTL_SECONDS = env_int("LEASE_TTL_SECONDS", 3600, minimum=1)
RUNNER_GRACE_SECONDS = env_float("RUNNER_GRACE_SECONDS", 30.0, minimum=0)
CHILD_READ_PAGE = env_int("CHILD_READ_PAGE", 128, minimum=1)
LEASE_RELEASE_WAIT_SECONDS = env_float("LEASE_RELEASE_WAIT_SECONDS", 5.0, minimum=0)
# Run tokens (SPEC §9): the longest a run token lives, even while its run keeps running.
RUN_TOKEN_TTL_SECONDS = env_int("RUN_TOKEN_TTL_SECONDS", 86400, minimum=1)
# Where agents reach /mcp, e.g. https://canopy.example.com; unset: the scheme and Host the
# runner's own socket used (right unless a proxy rewrites the Host).
CANOPY_PUBLIC_URL = env_str("CANOPY_PUBLIC_URL", "").rstrip("/")
# The longest an MCP read_child/delegate may wait (SPEC §9: 0-50 s).
MCP_MAX_WAIT_SECONDS = 50
# How often the runner consumer resends unanswered commands and sweeps expired leases.
OUTBOX_RESEND_SECONDS = env_float("OUTBOX_RESEND_SECONDS", 5.0, minimum=0.05)
# A runner socket silent this long (no touch from its server process, which touches every
# OUTBOX_RESEND_SECONDS) is treated as closed: its process died without saying so.
RUNNER_SILENT_SECONDS = env_float(
    "RUNNER_SILENT_SECONDS", max(15.0, 3 * OUTBOX_RESEND_SECONDS), minimum=OUTBOX_RESEND_SECONDS
)
# The most run.event frames one transaction commits: a runner socket's frames waiting behind
# each other, with what the process's other sockets hand in meanwhile (a group commit; each
# frame is still answered on its own). 1 commits every frame alone, as the benchmark does to
# measure the difference.
RUN_EVENT_GROUP_MAX = env_int("RUN_EVENT_GROUP_MAX", 100, minimum=1)
# Back-pressure (issue 39): once the oldest frame a process's runner sockets hold unanswered
# has waited RUN_EVENT_WAIT_MAX_MS, or they hold RUN_EVENT_PENDING_MAX frames, a new run.event
# is answered at once with -32603, data.retryable and data.retryAfterMs (the process's
# estimate of its drain), instead of waiting behind them. By wait, not count: a runner of the
# SDK keeps one frame in flight a run, so 5,000 runs a process hold up to 5,000 frames at a
# normal load; a limit of 2,000 frames refused them early and made events wait 3x longer.
RUN_EVENT_WAIT_MAX_MS = env_int("RUN_EVENT_WAIT_MAX_MS", 5000, minimum=0)
RUN_EVENT_PENDING_MAX = env_int("RUN_EVENT_PENDING_MAX", 20000, minimum=1)
# "process": one keep-alive (touch, outbox poll) for all of a process's runner sockets;
# "socket": a timer per socket, as before issue 39 (kept for the benchmark to compare).
RUNNER_KEEPALIVE = env_str("RUNNER_KEEPALIVE", "process").strip() or "process"
if RUNNER_KEEPALIVE not in ("process", "socket"):
    raise ImproperlyConfigured(
        f"RUNNER_KEEPALIVE must be process or socket, got {RUNNER_KEEPALIVE!r}"
    )
# --- Approvals (SPEC §11) ---
# A pending approval nobody decides within this is denied (status expired).
APPROVAL_TIMEOUT_SECONDS = env_float("APPROVAL_TIMEOUT_SECONDS", 900.0, minimum=1)
# ---
MAINTENANCE_INTERVAL_SECONDS = env_float("MAINTENANCE_INTERVAL_SECONDS", 1.0, minimum=0.05)
# Retention: see the "Retention and single sign-on" block at the end.
UPKEEP_IN_PROCESS = env_bool("UPKEEP_IN_PROCESS", True)
# Usage rollups on the ingest path (SPEC §10). Switched off only by the benchmark, to measure
# ingest with and without them in the same run; budgets on usage need them.
ROLLUPS_ENABLED = env_bool("ROLLUPS_ENABLED", True)
# Live doorbells: "process" joins each channel group once per process and fans out to its
# sockets (one message per process); "socket" joins per socket (one message per watcher).
LIVE_FANOUT = env_str("LIVE_FANOUT", "process").strip() or "process"
if LIVE_FANOUT not in ("process", "socket"):
    raise ImproperlyConfigured(f"LIVE_FANOUT must be process or socket, got {LIVE_FANOUT!r}")
LIVE_HEARTBEAT_SECONDS = env_float("LIVE_HEARTBEAT_SECONDS", 10.0, minimum=0.05)
# Unsent bytes a live socket may pile up before it pauses: nothing more is sent until the
# client has taken half of it, then it resumes from the database (the socket stays open).
LIVE_MAX_BACKLOG_BYTES = env_int("LIVE_MAX_BACKLOG_BYTES", 2 * 1024 * 1024, minimum=65536)
# A streamed HTTP response (NDJSON export) waits while this much is unsent to its client.
HTTP_MAX_UNSENT_BYTES = env_int("HTTP_MAX_UNSENT_BYTES", 1024 * 1024, minimum=65536)
# NDJSON exports one user may have streaming at once in one server process (more: 429).
EXPORT_MAX_CONCURRENT_PER_USER = env_int("EXPORT_MAX_CONCURRENT_PER_USER", 2, minimum=1)
# Trees one live socket may follow with `roots` subscriptions, across all its frames.
LIVE_MAX_ROOT_SUBSCRIPTIONS = env_int("LIVE_MAX_ROOT_SUBSCRIPTIONS", 1000, minimum=1)
# Live sockets one user may hold open at once in one server process.
LIVE_MAX_SOCKETS_PER_USER = env_int("LIVE_MAX_SOCKETS_PER_USER", 20, minimum=1)

# --- Alerts and metrics (SPEC §10) -----------------------------------------------------------

# A webhook POST gives up after this long (connect and read each); the sender never waits longer.
WEBHOOK_TIMEOUT_SECONDS = env_float("WEBHOOK_TIMEOUT_SECONDS", 5.0, minimum=0.1)
# Retries back off exponentially from the first to the longest delay, and a delivery not
# answered 2xx within WEBHOOK_GIVE_UP_SECONDS of being stored is given up.
WEBHOOK_RETRY_FIRST_SECONDS = env_float("WEBHOOK_RETRY_FIRST_SECONDS", 10.0, minimum=0.01)
WEBHOOK_RETRY_MAX_SECONDS = env_float("WEBHOOK_RETRY_MAX_SECONDS", 3600.0, minimum=0.01)
WEBHOOK_GIVE_UP_SECONDS = env_float("WEBHOOK_GIVE_UP_SECONDS", 86400.0, minimum=1)
WEBHOOK_CONCURRENCY = env_int("WEBHOOK_CONCURRENCY", 8, minimum=1)
# prometheus-client reads this itself; checked here so a bad value stops the process at start
# instead of failing the first increment.
PROMETHEUS_MULTIPROC_DIR = env_str("PROMETHEUS_MULTIPROC_DIR", "")
if PROMETHEUS_MULTIPROC_DIR and not (
    os.path.isdir(PROMETHEUS_MULTIPROC_DIR) and os.access(PROMETHEUS_MULTIPROC_DIR, os.W_OK)
):
    raise ImproperlyConfigured(
        f"PROMETHEUS_MULTIPROC_DIR must be an existing writable directory, got "
        f"{PROMETHEUS_MULTIPROC_DIR!r}"
    )

# --- Security (README "Production settings") ------------------------------------------------

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 12},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# Sign-in throttling: after this many failed sign-ins for one username from one address, that
# pair is locked out for AXES_COOLOFF_MINUTES (an admin unlocks earlier: manage.py axes_reset).
AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = env_float("AXES_COOLOFF_MINUTES", 15.0, minimum=0) / 60  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# The address is the client's as seen by the CANOPY_TRUSTED_PROXIES proxies in front of the
# server (0: clients connect directly), so behind a proxy a guesser locks out only itself.
CANOPY_TRUSTED_PROXIES = env_int("CANOPY_TRUSTED_PROXIES", 0, minimum=0)
AXES_CLIENT_IP_CALLABLE = "dashboard.security.client_address"
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False

# Served over HTTPS (usually behind a proxy that terminates TLS): all off by default so plain
# http://127.0.0.1 development keeps working; the README lists the production values.
if env_bool("SECURE_PROXY_SSL_HEADER", False):
    # Only behind a proxy that sets X-Forwarded-Proto itself and strips the client's.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
# A Prometheus server on this machine scrapes the daphne port itself, over plain HTTP.
SECURE_REDIRECT_EXEMPT = [r"^metrics$"]
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True

# --- The rest -------------------------------------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# Static files live inside their apps (dashboard/static), found by the app directories finder.
STATIC_ROOT = DATA_DIR / "staticfiles"

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "trees"
LOGOUT_REDIRECT_URL = "login"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Ordinary events (a 403, a client gone mid-answer) log one line, not a traceback.
    "filters": {"ordinary": {"()": "delegation.logfilters.OrdinaryEvents"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["ordinary"]}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "WARNING")},
}

# --- Trace export (SPEC §12, issue 27) ---------------------------------------------------------

# The standard OpenTelemetry variables. Off unless an endpoint is set: the traces endpoint is
# used as given; the base endpoint gets /v1/traces appended (the OTLP/HTTP rule).
OTEL_EXPORTER_OTLP_ENDPOINT = env_str("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = env_str("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
OTEL_TRACES_URL = OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or (
    OTEL_EXPORTER_OTLP_ENDPOINT.rstrip("/") + "/v1/traces" if OTEL_EXPORTER_OTLP_ENDPOINT else ""
)
if OTEL_TRACES_URL and not OTEL_TRACES_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured(
        f"the OTLP traces endpoint must be an http(s) URL: {OTEL_TRACES_URL!r}"
    )
OTEL_EXPORT_ENABLED = bool(OTEL_TRACES_URL)
# "key=value,key2=value2" (values URL-encoded), the traces-specific one overriding the other
# per key; secrets belong here (an API key), so they are never logged.
OTEL_EXPORTER_OTLP_HEADERS = env_str("OTEL_EXPORTER_OTLP_HEADERS", "")
OTEL_EXPORTER_OTLP_TRACES_HEADERS = env_str("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "")
OTEL_SERVICE_NAME = env_str("OTEL_SERVICE_NAME", "").strip() or "canopy"
# Message text (the request, the output, tool arguments and results) only when asked for.
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT = env_bool(
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", False
)
# A run still open after this long has its spans so far queued (sent again, complete, at its end).
OTEL_EXPORT_OPEN_AFTER_SECONDS = env_float("OTEL_EXPORT_OPEN_AFTER_SECONDS", 300.0, minimum=1)
# Runs whose spans go in one OTLP request, and the retry backoff of a failed request.
OTEL_EXPORT_BATCH_RUNS = env_int("OTEL_EXPORT_BATCH_RUNS", 200, minimum=1)
OTEL_EXPORT_RETRY_FIRST_SECONDS = env_float("OTEL_EXPORT_RETRY_FIRST_SECONDS", 2.0, minimum=0.01)
OTEL_EXPORT_RETRY_MAX_SECONDS = env_float("OTEL_EXPORT_RETRY_MAX_SECONDS", 300.0, minimum=0.01)
# One OTLP request gives up after this long (the exporter's own retries included).
OTEL_EXPORT_TIMEOUT_SECONDS = env_float("OTEL_EXPORT_TIMEOUT_SECONDS", 10.0, minimum=0.1)

# --- Retention and single sign-on (issue 28) -------------------------------------------------

# Days to keep each kind (0: forever). Events: a finished run's transcript (its usage events
# stay with the run); runs: whole finished trees; audit entries: the longest of the three.
EVENT_RETENTION_DAYS = env_int("EVENT_RETENTION_DAYS", 0, minimum=0)
RUN_RETENTION_DAYS = env_int("RUN_RETENTION_DAYS", 0, minimum=0)
AUDIT_RETENTION_DAYS = env_int("AUDIT_RETENTION_DAYS", 0, minimum=0)
# Rows one retention transaction deletes at most, how often the upkeep loop starts a pass, and
# how long it yields between batches so ingest gets the database in between.
RETENTION_BATCH_SIZE = env_int("RETENTION_BATCH_SIZE", 500, minimum=1)
RETENTION_INTERVAL_SECONDS = env_float("RETENTION_INTERVAL_SECONDS", 3600.0, minimum=0.05)
RETENTION_BATCH_PAUSE_SECONDS = env_float("RETENTION_BATCH_PAUSE_SECONDS", 0.05, minimum=0)


def check_retention(events: int, runs: int, audit: int) -> None:
    """Audit outlives what it describes, and a transcript cannot outlive its run."""
    if audit and (not runs or audit < runs):
        raise ImproperlyConfigured(
            f"AUDIT_RETENTION_DAYS ({audit}) must be 0 (forever) or at least RUN_RETENTION_DAYS "
            f"({runs or 'forever'}): the audit log is kept longest"
        )
    if audit and events and audit < events:
        raise ImproperlyConfigured(
            f"AUDIT_RETENTION_DAYS ({audit}) must be at least EVENT_RETENTION_DAYS ({events})"
        )
    if runs and events and events > runs:
        raise ImproperlyConfigured(
            f"EVENT_RETENTION_DAYS ({events}) must not exceed RUN_RETENTION_DAYS ({runs}): a "
            "run's events go with it"
        )


check_retention(EVENT_RETENTION_DAYS, RUN_RETENTION_DAYS, AUDIT_RETENTION_DAYS)

from canopy.sso_settings import sso_settings  # noqa: E402  (needs the helpers above)

globals().update(sso_settings(globals()))
if OIDC_ISSUER:  # noqa: F821  (set by sso_settings)
    AUTHENTICATION_BACKENDS.append("dashboard.sso.ProviderBackend")
    if not OIDC_LOCAL_PASSWORDS:  # noqa: F821
        AUTHENTICATION_BACKENDS.remove("django.contrib.auth.backends.ModelBackend")
