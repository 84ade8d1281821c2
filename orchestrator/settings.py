"""Loopwright settings: read only from environment variables, with working defaults.

The embedded default needs no servers: SQLite under ``var/``, a filesystem Celery broker and
an in-memory channel layer. Production sets ``DATABASE_URL`` (PostgreSQL), ``CELERY_BROKER_URL``
and ``REDIS_URL`` (Redis). Every variable is listed in the README.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from orchestrator.logcontext import log_format
from runtime.outbound import (
    OutboundPolicy,
    OutboundRefused,
    check_url,
    parse_hosts,
    parse_private_mode,
    parse_schemes,
)
from runtime.secrets import parse_secret_rule
from skillhub.services.localdir import parse_local_roots
from skillhub.services.s3ref import parse_s3_buckets

django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("LOOPWRIGHT_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def _secret_key() -> str:
    """SECRET_KEY from the environment, else generated once into var/ (never committed)."""
    key = os.environ.get("SECRET_KEY")
    if key:
        return key
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "*").split(",") if h.strip()]
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()
]
#: The base URL of links and printed addresses; unset: this machine at ``manage.py up``'s port.
PUBLIC_URL = os.environ.get(
    "LOOPWRIGHT_PUBLIC_URL", f"http://127.0.0.1:{os.environ.get('LOOPWRIGHT_PORT') or 8000}"
).rstrip("/")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "orchestrator",
    "orchestrator.accounts",
    "orchestrator.agents",
    "instructions",
    "harness",
    "loops",
    "skillhub",
    "gateway",
    "connectors",
    "memory",
    "knowledge",
    "frontend",
    "a2a_server",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "orchestrator.middleware.RequestIdMiddleware",
    "orchestrator.tracecontext.TraceparentMiddleware",
    "orchestrator.middleware.BoundedRequestMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "orchestrator.urls"
WSGI_APPLICATION = "orchestrator.wsgi.application"
ASGI_APPLICATION = "orchestrator.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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

# --- Database -------------------------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'loopwright.sqlite3'}"
#: ``transaction``: DATABASE_URL reaches PostgreSQL through a transaction-pooling proxy
#: (PgBouncer ``pool_mode = transaction``); empty: a direct connection (docs/operations.md).
DB_POOLER = os.environ.get("LOOPWRIGHT_DB_POOLER", "").strip().lower()
if DB_POOLER not in ("", "transaction"):
    raise ImproperlyConfigured(
        f"LOOPWRIGHT_DB_POOLER must be empty or 'transaction', not {DB_POOLER!r}"
    )
#: A direct connection (not through the pooler) for the live streams' ``LISTEN``; without it,
#: behind a pooler, streams poll (orchestrator.wakeups).
LISTEN_DATABASE_URL = os.environ.get("LOOPWRIGHT_LISTEN_DATABASE_URL", "")
_db: dict[str, Any] = dict(dj_database_url.parse(DATABASE_URL))
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets readers run beside the single writer; IMMEDIATE makes a write transaction take
    # the write lock up front, so concurrent writers queue on busy_timeout instead of failing
    # with "database is locked" when a read lock would have to be upgraded.
    _db["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": (
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=30000;"
            " PRAGMA foreign_keys=ON;"
        ),
    }
    _db["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
else:
    _db["CONN_MAX_AGE"] = env_int("DB_CONN_MAX_AGE", 60)
    _db["CONN_HEALTH_CHECKS"] = True
    _db.setdefault("OPTIONS", {})
    # Fail fast instead of hanging when the database is unreachable (D8: reconnect, not hang).
    _db["OPTIONS"].setdefault("connect_timeout", 5)
    # A process frozen inside a transaction (SIGSTOP, a VM pause, a debugger) would hold its row
    # locks forever and stall every other worker that touches those rows (a pattern's shared
    # daily budget, say). PostgreSQL ends such a session after this long idle in a transaction;
    # the frozen process finds its connection gone when it wakes, and its lease is fenced anyway.
    # Nothing of ours keeps a transaction open while it waits (models and tools run outside).
    _idle_tx_ms = int(env_float("LOOPWRIGHT_DB_IDLE_TX_TIMEOUT_SECONDS", 30.0) * 1000)
    # Behind a transaction pooler the startup ``options`` are refused (PgBouncer: "unsupported
    # startup parameter"); the pooler's own idle_transaction_timeout does this job there.
    if _idle_tx_ms > 0 and not DB_POOLER:
        _db["OPTIONS"]["options"] = (
            f"{_db['OPTIONS'].get('options', '')} "
            f"-c idle_in_transaction_session_timeout={_idle_tx_ms}"
        ).strip()
    if DB_POOLER:
        # Each transaction may run on another server session: nothing may outlive one. No
        # automatic prepares (psycopg's), no holdable server-side cursors (``.iterator()``); the
        # SQL-level PREPARE fast paths run their statements unprepared (orchestrator.sql).
        _db["OPTIONS"]["prepare_threshold"] = None
        _db["DISABLE_SERVER_SIDE_CURSORS"] = True
DATABASES = {"default": _db}
DB_VENDOR = "sqlite" if _db["ENGINE"].endswith("sqlite3") else "postgresql"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
MEDIA_ROOT = VAR_DIR / "media"
LOGIN_URL = "/login"

# --- Redis, Celery, channel layer -------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")
BROKER_DIR = VAR_DIR / "broker"
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    BROKER_DIR.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT = "orchestrator.broker:Transport"  # atomic message files
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any] = {
        "data_folder_in": str(BROKER_DIR),
        "data_folder_out": str(BROKER_DIR),
        "control_folder": str(BROKER_DIR / "control"),
        "polling_interval": 0.05,
    }
else:
    # A visibility timeout well above our longest task (tasks are short nudges, see docs/).
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": env_int("LOOPWRIGHT_BROKER_VISIBILITY_TIMEOUT", 3600)
    }

# --- Loopwright engine ------------------------------------------------------------------------
LOOPWRIGHT: dict[str, Any] = {
    "LEASE_SECONDS": env_float("LOOPWRIGHT_LEASE_SECONDS", 60.0),
    "HEARTBEAT_SECONDS": env_float("LOOPWRIGHT_HEARTBEAT_SECONDS", 15.0),
    "REAPER_INTERVAL_SECONDS": env_float("LOOPWRIGHT_REAPER_INTERVAL_SECONDS", 5.0),
    "POLL_INTERVAL_SECONDS": env_float("LOOPWRIGHT_POLL_INTERVAL_SECONDS", 2.0),
    "MAX_ATTEMPTS": env_int("LOOPWRIGHT_MAX_ATTEMPTS", 5),
    "DRIVER_CAPACITY": env_int("LOOPWRIGHT_DRIVER_CAPACITY", 200),
    "DRIVER_DB_THREADS": env_int("LOOPWRIGHT_DRIVER_DB_THREADS", 4),
    "DRAIN_SECONDS": env_float("LOOPWRIGHT_DRAIN_SECONDS", 30.0),
    "LOCK_RETRY_SECONDS": env_float("LOOPWRIGHT_LOCK_RETRY_SECONDS", 2.0),
    "INVOKER": os.environ.get("LOOPWRIGHT_INVOKER", "loops.worker.invoker.AgentInvoker"),
    "APPROVAL_WEBHOOK_URL": os.environ.get("LOOPWRIGHT_APPROVAL_WEBHOOK_URL", ""),
    "APPROVAL_EMAILS": os.environ.get("LOOPWRIGHT_APPROVAL_EMAILS", ""),
    # How late a cron tick may run and still count a due time as on time (``skip`` policy).
    "CRON_GRACE_SECONDS": env_float("LOOPWRIGHT_CRON_GRACE_SECONDS", 60.0),
    # Events of runs that ended longer ago than this are pruned (0: kept forever); the run, its
    # steps, approvals and stored spans stay (docs/operations.md, Retention).
    "EVENT_RETENTION_DAYS": env_float("LOOPWRIGHT_EVENT_RETENTION_DAYS", 0.0),
}
if LOOPWRIGHT["EVENT_RETENTION_DAYS"] < 0:
    raise ImproperlyConfigured("LOOPWRIGHT_EVENT_RETENTION_DAYS must be 0 (keep) or more days.")

# --- Outbound guard and server secrets (docs/security.md) ----------------------------------------
# Parsed here so that a bad value stops every process at start, naming the variable.
try:
    LOOPWRIGHT_OUTBOUND: dict[str, Any] = {
        # Loopback and private ranges for model endpoints, webhooks and Git import: allow | deny.
        "PRIVATE": parse_private_mode(os.environ.get("LOOPWRIGHT_OUTBOUND_PRIVATE")),
        # Git import: URL schemes (http, https) and hosts (empty: any host the guard allows).
        "GIT_SCHEMES": parse_schemes(
            os.environ.get("LOOPWRIGHT_GIT_SCHEMES"),
            setting="LOOPWRIGHT_GIT_SCHEMES",
            default="https",
            permitted=("http", "https"),
        ),
        "GIT_HOSTS": parse_hosts(
            os.environ.get("LOOPWRIGHT_GIT_HOSTS"), setting="LOOPWRIGHT_GIT_HOSTS"
        ),
    }
    # Variables a model endpoint (or any connector) may name as its key: under the prefix, or
    # on the allow list; never one of the server's own.
    LOOPWRIGHT_SECRETS = parse_secret_rule(
        os.environ.get("LOOPWRIGHT_SECRET_PREFIX"), os.environ.get("LOOPWRIGHT_SECRET_ALLOW")
    )
    if LOOPWRIGHT["APPROVAL_WEBHOOK_URL"]:
        _webhook_policy = OutboundPolicy(private=LOOPWRIGHT_OUTBOUND["PRIVATE"])
        check_url(LOOPWRIGHT["APPROVAL_WEBHOOK_URL"], _webhook_policy)
except (ValueError, OutboundRefused) as _exc:
    _which = "LOOPWRIGHT_APPROVAL_WEBHOOK_URL: " if isinstance(_exc, OutboundRefused) else ""
    raise ImproperlyConfigured(f"{_which}{_exc}") from None

# --- Skill Hub local-dir roots and s3 buckets (docs/skills.md) ---------------------------------
# Folders local-dir skills may be copied from; none by default. A relative path, '/' or a host
# system directory stops every process at start, naming the variable; so does a bad bucket name.
try:
    _SKILL_LOCAL_ROOTS = parse_local_roots(os.environ.get("LOOPWRIGHT_SKILL_LOCAL_ROOTS"))
    _SKILL_S3_BUCKETS = parse_s3_buckets(os.environ.get("LOOPWRIGHT_SKILL_S3_BUCKETS"))
except ValueError as _exc:
    raise ImproperlyConfigured(str(_exc)) from None

# --- Skill Hub (docs/skills.md) -----------------------------------------------------------------
SKILLHUB: dict[str, Any] = {
    # Absolute folders local-dir skills must lie in (skillhub.services.localdir); () = none.
    "LOCAL_ROOTS": _SKILL_LOCAL_ROOTS,
    # Buckets s3 skills may be fetched from (skillhub.services.s3ref); () = none. The endpoint
    # of an S3-compatible store (empty: AWS), the region (empty: the AWS chain's) and the
    # client's connect/read timeout. Credentials: the standard AWS chain, never a setting here.
    "S3_BUCKETS": _SKILL_S3_BUCKETS,
    "S3_ENDPOINT_URL": os.environ.get("LOOPWRIGHT_SKILL_S3_ENDPOINT_URL", ""),
    "S3_REGION": os.environ.get("LOOPWRIGHT_SKILL_S3_REGION", ""),
    "S3_TIMEOUT_SECONDS": env_float("LOOPWRIGHT_SKILL_S3_TIMEOUT_SECONDS", 10.0),
    # The Celery queue skill executions are sent to (a skills worker runs ``-Q <it>``).
    "QUEUE": os.environ.get("LOOPWRIGHT_SKILL_QUEUE", "skills"),
    # Executions each principal (API user or AI employee) may request per minute.
    "RATE_LIMIT_PER_MINUTE": env_int("LOOPWRIGHT_SKILL_RATE_LIMIT_PER_MINUTE", 30),
    # A claimed execution's lease: its timeout plus this margin (the run is never longer).
    "LEASE_MARGIN_SECONDS": env_float("LOOPWRIGHT_SKILL_LEASE_MARGIN_SECONDS", 30.0),
    "POLLER_INTERVAL_SECONDS": env_float("LOOPWRIGHT_SKILL_POLLER_INTERVAL_SECONDS", 10.0),
    # A queued execution nobody claimed for this long is nudged again (a lost message).
    "RENUDGE_AFTER_SECONDS": env_float("LOOPWRIGHT_SKILL_RENUDGE_AFTER_SECONDS", 30.0),
    # Largest output file the download action serves.
    "DOWNLOAD_MAX_BYTES": env_int("LOOPWRIGHT_SKILL_DOWNLOAD_MAX_BYTES", 10 * 1024 * 1024),
    # Hosts (Host header) the MCP endpoint accepts besides loopback; comma-separated.
    "MCP_ALLOWED_HOSTS": [
        host.strip()
        for host in os.environ.get("LOOPWRIGHT_MCP_ALLOWED_HOSTS", "").split(",")
        if host.strip()
    ],
    # Every MCP request is answered on its own, with no session kept in the process: any web
    # replica serves any request (no sticky sessions needed).
    "MCP_STATELESS": env_bool("LOOPWRIGHT_MCP_STATELESS", False),
    # Package environments of skills (skillhub.services.envbuild): where they are cached on
    # this host (each component traversable by the sandbox uid), their size cap, how long one
    # build may take, and the indexes pip and npm install from.
    "ENV_DIR": os.environ.get("LOOPWRIGHT_SKILL_ENV_DIR") or str(VAR_DIR / "skill-envs"),
    "ENV_MAX_MB": env_int("LOOPWRIGHT_SKILL_ENV_MAX_MB", 512),
    "ENV_BUILD_TIMEOUT_SECONDS": env_float("LOOPWRIGHT_SKILL_ENV_BUILD_TIMEOUT", 300.0),
    "PIP_INDEX_URL": os.environ.get("LOOPWRIGHT_SKILL_PIP_INDEX_URL") or "https://pypi.org/simple",
    "NPM_REGISTRY": os.environ.get("LOOPWRIGHT_SKILL_NPM_REGISTRY")
    or "https://registry.npmjs.org/",
}

#: Hard ceilings of every harness compilation (JSON, same schema as a profile's settings).
LOOPWRIGHT_HARNESS_PLATFORM: dict[str, Any] = json.loads(
    os.environ.get("LOOPWRIGHT_HARNESS_PLATFORM") or "{}"
)

# Server folders synced into knowledge bases and skills directories (empty: under VAR_DIR), and
# the largest knowledge document (docs/knowledge.md, docs/skill-directories.md).
LOOPWRIGHT_KNOWLEDGE_ROOT = os.environ.get("LOOPWRIGHT_KNOWLEDGE_ROOT", "")
LOOPWRIGHT_KNOWLEDGE_MAX_DOCUMENT_BYTES = env_int(
    "LOOPWRIGHT_KNOWLEDGE_MAX_DOCUMENT_BYTES", 20 * 1024 * 1024
)
LOOPWRIGHT_SKILLS_ROOT = os.environ.get("LOOPWRIGHT_SKILLS_ROOT", "")

# --- REST framework ---------------------------------------------------------------------------
# Request bodies (docs/api.md, Input bounds): one limit for the API's JSON, the UI's forms
# and webhook deliveries; a larger body is a 413 problem naming it. Django's own limit is the
# same number, so nothing parses a body this one would refuse.
LOOPWRIGHT_MAX_BODY_BYTES = env_int("LOOPWRIGHT_MAX_BODY_BYTES", 8 * 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = LOOPWRIGHT_MAX_BODY_BYTES

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "orchestrator.accounts.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["orchestrator.accounts.permissions.IsViewer"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["orchestrator.filters.BoundedFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "orchestrator.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "orchestrator.errors.problem_exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["orchestrator.parsers.BoundedJSONParser"],
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Loopwright API",
    "DESCRIPTION": (
        "Control plane for durable, policy-governed, multi-role AI agent loops. "
        "Errors are application/problem+json (RFC 9457). Authenticate with "
        "`Authorization: Bearer <token>` (see `manage.py create_api_token`) or a session."
    ),
    "VERSION": "1.0.0",
    # Operation ids read `runs_events_list`; tags are set by the hook below.
    "SCHEMA_PATH_PREFIX": r"/api/v1/",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "loops.models.RunStatus",
        "ChatCompletionStatusEnum": "gateway.models.CompletionStatus",
        "SkillExecutionStatusEnum": "skillhub.models.ExecutionStatus",
        "A2AAgentEffectEnum": "connectors.models.AgentEffect",
        # Harness profile and instruction versions share it (draft, published).
        "VersionStatusEnum": "harness.models.VersionStatus",
        "ToolEffectEnum": [("read", "read"), ("write", "write"), ("external", "external")],
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "orchestrator.openapi.add_problem_responses",
        "orchestrator.openapi.tag_operations",
    ],
}

# E-mail (approval notifications): Django's SMTP backend when EMAIL_HOST is set.
EMAIL_HOST = os.environ.get("EMAIL_HOST", "")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "loopwright@localhost")
if not EMAIL_HOST:
    EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"

# --- Prometheus metrics (docs/observability.md) -------------------------------------------------
# Every process of one host writes its counters under this folder (prometheus_client's
# multiprocess mode); ``/metrics`` on the web process adds them up.
METRICS_DIR = Path(os.environ.get("LOOPWRIGHT_METRICS_DIR") or VAR_DIR / "metrics")
# When set, ``/metrics`` answers only ``Authorization: Bearer <this>``; else it is open.
METRICS_TOKEN = os.environ.get("LOOPWRIGHT_METRICS_TOKEN", "")
# A worker serves its host's counters on this port too (0: off), bound to this address.
METRICS_WORKER_PORT = env_int("LOOPWRIGHT_METRICS_WORKER_PORT", 0)
METRICS_WORKER_ADDR = os.environ.get("LOOPWRIGHT_METRICS_WORKER_ADDR", "127.0.0.1")

# --- Logs: plain lines, or JSON lines (LOG_FORMAT=json) ----------------------------------------
try:
    LOG_FORMAT = log_format(os.environ.get("LOG_FORMAT"))
except ValueError as _exc:
    raise ImproperlyConfigured(str(_exc)) from None
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        # One JSON object per line with the request and run ids (orchestrator/logcontext.py).
        "json": {"()": "orchestrator.logcontext.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # kombu warns on every connection of the (hostless) filesystem broker.
        "kombu.connection": {"level": "ERROR"},
    },
}
