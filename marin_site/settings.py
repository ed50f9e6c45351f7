"""Settings for marin-site, read from environment variables.

One module for every environment: development uses the embedded defaults (a SQLite
file and a filesystem broker that needs no server), production sets DATABASE_URL,
CELERY_BROKER_URL, SECRET_KEY, ALLOWED_HOSTS and DEBUG=0. Production only hardens.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
# Everything the site writes on its machine (the SQLite file, the filesystem broker's folders,
# beat's schedule, runs' working directories) lives here, never in the working directory.
VAR_DIR = Path(os.environ.get("MARIN_VAR_DIR", BASE_DIR / "var")).expanduser().resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


DEBUG = env_bool("DEBUG", default=True)
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off.")
    SECRET_KEY = "dev-only-insecure-key-do-not-use-in-production"  # noqa: S105

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")
SITE_URL = os.environ.get("SITE_URL", "http://127.0.0.1:8000").rstrip("/")

INSTALLED_APPS = [
    "marin_site.apps.SiteAdminConfig",  # django.contrib.admin with the site's admin site
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django.contrib.sites",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "rules",
    "allauth",
    "allauth.account",
    "allauth.socialaccount",
    "allauth.socialaccount.providers.github",
    "csp",
    "runs",
    "proposals",
]

MIDDLEWARE = [
    "marin_site.middleware.RunnerLaneMiddleware",  # the metrics door's batches: only what acts
    "marin_site.middleware.RequestBodyCapMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "marin_site.middleware.PolicyMiddleware",  # django-csp's, its policy built once
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "marin_site.middleware.FormEncodingMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "marin_site.pagecache.PublicPageCacheMiddleware",
]

ROOT_URLCONF = "marin_site.urls"
WSGI_APPLICATION = "marin_site.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "marin_site.context_processors.site",
            ],
        },
    },
]

# Database: DATABASE_URL, or (unset or empty) a SQLite file under var/ for one machine.
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'marin-site.sqlite3'}",
        conn_max_age=int(os.environ.get("DATABASE_CONN_MAX_AGE", "60")),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # SQLite serves one machine: wait for the worker's writes instead of failing.
    DATABASES["default"]["OPTIONS"] = {"timeout": 20, "transaction_mode": "IMMEDIATE"}
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # Tests on SQLite use a file too: Django's default in-memory test database answers
    # "table is locked" at once, without the timeout, when the live server or the worker
    # thread writes, where the file waits as it does in production.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-marin-site.sqlite3")}
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # The site's queries are short; PostgreSQL's JIT compiles the ones it costs high (the
    # search's subqueries) for longer than they take to run.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("options", "-c jit=off")
    # The test database's name (bin/test gives each run its own, so suites never meet), and
    # the tests' backend, which empties it between transactional tests by DELETE instead of
    # TRUNCATE (tests/postgresql/base.py: 20 ms where TRUNCATE takes 0.4 to 1 s).
    if test_name := os.environ.get("TEST_DATABASE_NAME"):
        DATABASES["default"]["TEST"] = {"NAME": test_name}
        DATABASES["default"]["ENGINE"] = "tests.postgresql"
    # A pool of this many connections per process (psycopg_pool), for a server whose threads
    # each take a connection for one request and give it back (the agents' door, README):
    # no connection is opened per request, and no more than this are ever open.
    if pool_size := int(os.environ.get("DATABASE_POOL_SIZE", "0")):
        DATABASES["default"]["OPTIONS"]["pool"] = {"min_size": 1, "max_size": pool_size}
        DATABASES["default"]["CONN_MAX_AGE"] = 0  # Django's pool needs it so
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
AUTHENTICATION_BACKENDS = [
    "rules.permissions.ObjectPermissionBackend",
    "django.contrib.auth.backends.ModelBackend",
    "allauth.account.auth_backends.AuthenticationBackend",
]
SITE_ID = 1
LOGIN_URL = "account_login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"

# django-allauth: local accounts, plus GitHub when its OAuth app is configured.
ACCOUNT_LOGIN_METHODS = {"username", "email"}
ACCOUNT_SIGNUP_FIELDS = ["email*", "username*", "password1*", "password2*"]
ACCOUNT_EMAIL_VERIFICATION = os.environ.get("ACCOUNT_EMAIL_VERIFICATION", "none")
SOCIALACCOUNT_LOGIN_ON_GET = False
SOCIALACCOUNT_PROVIDERS: dict[str, dict[str, object]] = {"github": {"SCOPE": ["read:user"]}}
GITHUB_OAUTH_CLIENT_ID = os.environ.get("GITHUB_OAUTH_CLIENT_ID", "")
GITHUB_OAUTH_SECRET = os.environ.get("GITHUB_OAUTH_SECRET", "")
if GITHUB_OAUTH_CLIENT_ID and GITHUB_OAUTH_SECRET:
    SOCIALACCOUNT_PROVIDERS["github"]["APPS"] = [
        {"client_id": GITHUB_OAUTH_CLIENT_ID, "secret": GITHUB_OAUTH_SECRET, "key": ""}
    ]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", VAR_DIR / "static"))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # collectstatic fills it; whitenoise serves it
STATICFILES_DIRS: list[Path | tuple[str, Path]] = [BASE_DIR / "static"]
# The charts' library, installed by bin/setup from package-lock.json (npm ci), served as
# static/uplot/...; node_modules is not in the repository.
STATICFILES_DIRS += [("uplot", BASE_DIR / "node_modules" / "uplot" / "dist")]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "marin_site.staticfiles.StaticFilesStorage"  # whitenoise's, never a 500
            if not DEBUG
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}

# Request bodies: Django's own cap for form and JSON bodies; larger ones get a 413.
REQUEST_BODY_CAP = int(os.environ.get("REQUEST_BODY_CAP", str(1024 * 1024)))
DATA_UPLOAD_MAX_MEMORY_SIZE = REQUEST_BODY_CAP

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": "marin-site",
    }
}
if os.environ.get("CACHE_URL", "").startswith("redis"):
    CACHES["default"] = {
        "BACKEND": "marin_site.cache.RedisCache",  # Django's, one client per pool
        "LOCATION": os.environ["CACHE_URL"],
    }

# Whether every process (web and worker) sees the same cache.
SHARED_CACHE = CACHES["default"]["BACKEND"].endswith("RedisCache")

# Public pages for anonymous readers, from the shared cache (see marin_site/pagecache.py).
# Off by default without a shared cache: a per-process memory cache cannot see the
# worker's writes.
PAGE_CACHE_SECONDS = int(os.environ.get("PAGE_CACHE_SECONDS", "30" if SHARED_CACHE else "0"))
# Fragments of pages shared by every reader, signed in or not (see marin_site/fragments.py):
# keyed by the versions of what they show, so they live until it changes; the lifetime only
# bounds a write that slipped past the bump. Off without a shared cache, as above.
FRAGMENT_CACHE_SECONDS = int(
    os.environ.get("FRAGMENT_CACHE_SECONDS", "600" if SHARED_CACHE else "0")
)
# Signed-in readers' sessions: from the shared cache, written through to the database.
if SHARED_CACHE:
    SESSION_ENGINE = "django.contrib.sessions.backends.cached_db"
PAGE_CACHE_VIEWS = frozenset(
    {
        "proposals:list",
        "proposals:detail",
        "proposals:archive",
        "proposals:search",
        "proposal-list",
        "proposal-detail",
        # A campaign's page: its shell may lag a write by PAGE_CACHE_SECONDS at most (metric
        # points bump no generation); the figures that move are polled from the chart data.
        "campaigns:list",
        "campaigns:detail",
        # The board: a track ranked again bumps the generation (runs/board/rank.py); the
        # export is streamed and the feed is a feed (as the others, not kept).
        "board:board",
        "board:chart",
        "board-entries",
        "board-tracks",
    }
)

# Celery: Redis in production; a filesystem broker (no server) by default. Kombu's folders
# default to paths relative to the working directory (control/ beside the code): name them all.
BROKER_DIR = VAR_DIR / "broker"
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://localhost/")
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),
        "store_processed": False,
    }
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")  # not ./celerybeat-schedule
CELERY_BROKER_CONNECTION_TIMEOUT = 3
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_TIMEZONE = TIME_ZONE

# Runs: executors, limits and the reconciler (a Celery beat task).
RUNS_DEFAULT_EXECUTOR = os.environ.get("RUNS_DEFAULT_EXECUTOR", "local")
RUNS_EXECUTOR_MAX_CONCURRENT = {
    "local": int(os.environ.get("RUNS_LOCAL_MAX_CONCURRENT", "2")),
    "ray": int(os.environ.get("RUNS_RAY_MAX_CONCURRENT", "8")),
    "iris": int(os.environ.get("RUNS_IRIS_MAX_CONCURRENT", "16")),
}
# Who may launch on an executor: "iris=alice,bob;ray=carol" (usernames); an executor not
# named here takes any maintainer's approval. A pool keeps its own list (Pool.launchers).
RUNS_EXECUTOR_LAUNCHERS: dict[str, list[str]] = {
    executor.strip(): [name.strip() for name in names.split(",") if name.strip()]
    for executor, _, names in (
        part.partition("=") for part in os.environ.get("RUNS_EXECUTOR_LAUNCHERS", "").split(";")
    )
    if executor.strip()
}
RUNS_PLAN_MAX_CONCURRENT = int(os.environ.get("RUNS_PLAN_MAX_CONCURRENT", "4"))
RUNS_MAX_ATTEMPTS = int(os.environ.get("RUNS_MAX_ATTEMPTS", "3"))
RUNS_HEARTBEAT_TIMEOUT_SECONDS = int(os.environ.get("RUNS_HEARTBEAT_TIMEOUT_SECONDS", "300"))
RUNS_TIME_LIMIT_SECONDS = int(os.environ.get("RUNS_TIME_LIMIT_SECONDS", "3600"))
# A run token stops working this long after its run's time limit has run out.
RUNS_TOKEN_GRACE_SECONDS = int(os.environ.get("RUNS_TOKEN_GRACE_SECONDS", str(24 * 3600)))
RUNS_LOCAL_GRACE_SECONDS = float(os.environ.get("RUNS_LOCAL_GRACE_SECONDS", "10"))
RUNS_WORK_DIR = Path(os.environ.get("RUNS_WORK_DIR", VAR_DIR / "runs"))
RUNS_OUTPUT_ROOT = os.environ.get("RUNS_OUTPUT_ROOT", "")
# The repository whose commits approvals pin; jobs run from a clean checkout of it.
RUNS_CODE_REPOSITORY = os.environ.get("RUNS_CODE_REPOSITORY", "")
RUNS_DRY_RUN_EXECUTOR = os.environ.get("RUNS_DRY_RUN_EXECUTOR", "local")
RUNS_DRY_RUN_TIME_LIMIT_SECONDS = int(os.environ.get("RUNS_DRY_RUN_TIME_LIMIT_SECONDS", "900"))
RUNS_CODE_DIR = Path(os.environ.get("RUNS_CODE_DIR", VAR_DIR / "code"))
RUNS_API_URL = os.environ.get("RUNS_API_URL", f"{SITE_URL}/api/v1/")
RUNS_SECRET_ENV = env_list("RUNS_SECRET_ENV", "WANDB_API_KEY")
RUNS_METRICS_MAX_POINTS = int(os.environ.get("RUNS_METRICS_MAX_POINTS", "1000"))
RUNS_METRICS_RATE_PER_MINUTE = int(os.environ.get("RUNS_METRICS_RATE_PER_MINUTE", "600"))
RUNS_RECONCILE_SECONDS = float(os.environ.get("RUNS_RECONCILE_SECONDS", "30"))
# Charts read downsampled series (runs/series/), refreshed this long after metrics arrive.
RUNS_SERIES_REFRESH_SECONDS = int(os.environ.get("RUNS_SERIES_REFRESH_SECONDS", "5"))
# Pools and agents (runs/pools/): an agent's lease lasts this long unless renewed; a poll is
# held at most RUNS_AGENT_POLL_SECONDS, looking at the database again at least every
# RUNS_AGENT_RECHECK_SECONDS whatever the wake-ups say.
RUNS_AGENT_LEASE_SECONDS = int(os.environ.get("RUNS_AGENT_LEASE_SECONDS", "60"))
RUNS_AGENT_POLL_SECONDS = float(os.environ.get("RUNS_AGENT_POLL_SECONDS", "25"))
RUNS_AGENT_RECHECK_SECONDS = float(os.environ.get("RUNS_AGENT_RECHECK_SECONDS", "5"))
RUNS_AGENT_LOG_TAIL_BYTES = int(os.environ.get("RUNS_AGENT_LOG_TAIL_BYTES", "65536"))
RUNS_AGENT_GRACE_SECONDS = float(os.environ.get("RUNS_AGENT_GRACE_SECONDS", "30"))
# Agents' requests using the database at once, per server process (held polls use none, nor
# a poll handed its lease: its answer was built by the poll that leased it).
RUNS_AGENT_DB_SLOTS = int(os.environ.get("RUNS_AGENT_DB_SLOTS", "8"))
# On a wake-up, one held poll per process leases runs for the waiting polls of its pool, at
# most this many per transaction (runs.pools.handout): by default every one of them at once.
RUNS_AGENT_LEASE_BATCH = int(os.environ.get("RUNS_AGENT_LEASE_BATCH", "256"))
# A claimed run (executed by hand) may stay silent this long before it is crashed.
RUNS_CLAIM_HEARTBEAT_TIMEOUT_SECONDS = int(
    os.environ.get("RUNS_CLAIM_HEARTBEAT_TIMEOUT_SECONDS", "3600")
)
RUNS_REGISTRATION_TOKEN_DAYS = int(os.environ.get("RUNS_REGISTRATION_TOKEN_DAYS", "7"))
RAY_ADDRESS = os.environ.get("RAY_ADDRESS", "")  # unset: runs for `ray` wait in the queue
RUNS_RAY_PYTHON = os.environ.get("RUNS_RAY_PYTHON", "")
# Iris (runs/executors/iris.py): the controller, and the `iris` command that submits to it
# (blank: .venv-iris/bin/iris, made by bin/setup-iris; e.g. `uv run iris` in a Marin checkout).
RUNS_IRIS_CONTROLLER_URL = os.environ.get("RUNS_IRIS_CONTROLLER_URL", "")  # unset: runs wait
# Or the cluster as Marin names it: `iris --cluster NAME` (found in Iris's config search
# paths), or `iris --config PATH` (a cluster config file); one of the three, not two.
RUNS_IRIS_CLUSTER = os.environ.get("RUNS_IRIS_CLUSTER", "")
RUNS_IRIS_CONFIG = os.environ.get("RUNS_IRIS_CONFIG", "")
RUNS_IRIS_COMMAND = os.environ.get("RUNS_IRIS_COMMAND", "")
RUNS_IRIS_HOME = os.environ.get("RUNS_IRIS_HOME", "")  # the command's HOME (its credentials)
RUNS_IRIS_JOB_PREFIX = os.environ.get("RUNS_IRIS_JOB_PREFIX", "marin-site")
RUNS_IRIS_LOCAL = env_bool("RUNS_IRIS_LOCAL", default=False)  # tasks run on this machine
RUNS_IRIS_SUBMIT_TIMEOUT = float(os.environ.get("RUNS_IRIS_SUBMIT_TIMEOUT", "120"))
RUNS_IRIS_LOGS_TIMEOUT = float(os.environ.get("RUNS_IRIS_LOGS_TIMEOUT", "10"))
RUNS_IRIS_BACKOFF_SECONDS = float(os.environ.get("RUNS_IRIS_BACKOFF_SECONDS", "15"))
RUNS_IRIS_BACKOFF_MAX_SECONDS = float(os.environ.get("RUNS_IRIS_BACKOFF_MAX_SECONDS", "600"))
# Submits go to a long-lived submitter per worker (runs/executors/iris_process.py), run by the
# Python of Iris's environment (unset: the one beside RUNS_IRIS_COMMAND); `command`: one
# `iris job run` process per submit.
RUNS_IRIS_SUBMITTER = os.environ.get("RUNS_IRIS_SUBMITTER", "process")
RUNS_IRIS_PYTHON = os.environ.get("RUNS_IRIS_PYTHON", "")
RUNS_IRIS_SUBMITTER_IDLE_SECONDS = float(os.environ.get("RUNS_IRIS_SUBMITTER_IDLE_SECONDS", "900"))
# tracker_metrics.jsonl uploads (runs/trackers/jsonl.py): streamed, never held in memory.
RUNS_TRACKER_IMPORT_MAX_BYTES = int(
    os.environ.get("RUNS_TRACKER_IMPORT_MAX_BYTES", str(1024 * 1024 * 1024))
)
# The importers of the project's past (marin_site/importing.py): the largest source read,
# and the URL schemes read through fsspec (gs:// needs the `gcs` extra).
IMPORTS_MAX_BYTES = int(os.environ.get("IMPORTS_MAX_BYTES", str(1024 * 1024 * 1024)))
IMPORTS_URL_SCHEMES = env_list("IMPORTS_URL_SCHEMES", "file,gs,gcs")
# Links kept as canonical ids (wandb:..., gh:...#N, data:...) are shown with these hosts
# (marin_site/links.py); a host that moves is a change here plus `manage.py links_rewrite`.
WANDB_BASE_URL = os.environ.get("WANDB_BASE_URL", "https://wandb.ai").rstrip("/")
GITHUB_BASE_URL = os.environ.get("GITHUB_BASE_URL", "https://github.com").rstrip("/")
DATA_BROWSER_URL = os.environ.get("DATA_BROWSER_URL", "").rstrip("/")
# The MLflow tracking API (runs/mlflow/): where jobs are told to send MLflow calls.
RUNS_MLFLOW_TRACKING_URI = os.environ.get("RUNS_MLFLOW_TRACKING_URI", f"{SITE_URL}/mlflow")
RUNS_BOARD_RANK_SECONDS = int(os.environ.get("RUNS_BOARD_RANK_SECONDS", "3600"))
CELERY_BEAT_SCHEDULE = {
    "runs-reconcile": {"task": "runs.reconcile", "schedule": RUNS_RECONCILE_SECONDS},
    "runs-series-refresh": {
        "task": "runs.series_refresh_stale",
        "schedule": RUNS_RECONCILE_SECONDS,
    },
    "runs-alerts-silence-check": {
        "task": "runs.alerts_silence_check",
        "schedule": RUNS_RECONCILE_SECONDS,
    },
    "runs-tracker-imports-resume": {
        "task": "runs.tracker_imports_resume",
        "schedule": RUNS_RECONCILE_SECONDS,
    },
    # The board: every track ranked again, in case a nudge was lost (runs/board/rank.py).
    "runs-board-rank": {"task": "runs.board_rank", "schedule": RUNS_BOARD_RANK_SECONDS},
}

# GitHub issue sync (proposals/github/): off unless GITHUB_TOKEN and GITHUB_REPOSITORY are set.
GITHUB_REPOSITORY = os.environ.get("GITHUB_REPOSITORY", "")
GITHUB_API_URL = os.environ.get("GITHUB_API_URL", "https://api.github.com").rstrip("/")
GITHUB_TOKEN = os.environ.get("GITHUB_TOKEN", "")
GITHUB_WEBHOOK_SECRET = os.environ.get("GITHUB_WEBHOOK_SECRET", "")
GITHUB_BOT_LOGIN = os.environ.get("GITHUB_BOT_LOGIN", "")
GITHUB_MAINTAINERS = env_list("GITHUB_MAINTAINERS")
GITHUB_REVIEWERS = env_list("GITHUB_REVIEWERS")
# How many reviews by someone else a maintainer's own proposal needs before they may approve it.
PROPOSALS_APPROVAL_MIN_OTHER_REVIEWS = int(
    os.environ.get("PROPOSALS_APPROVAL_MIN_OTHER_REVIEWS", "1")
)
GITHUB_ISSUE_RECIPE = os.environ.get("GITHUB_ISSUE_RECIPE", "")
GITHUB_TIMEOUT_SECONDS = int(os.environ.get("GITHUB_TIMEOUT_SECONDS", "10"))
GITHUB_SECONDS_BETWEEN_WRITES = float(os.environ.get("GITHUB_SECONDS_BETWEEN_WRITES", "1.0"))
GITHUB_OUTBOX_MAX_ATTEMPTS = int(os.environ.get("GITHUB_OUTBOX_MAX_ATTEMPTS", "12"))
GITHUB_OUTBOX_BACKOFF_SECONDS = float(os.environ.get("GITHUB_OUTBOX_BACKOFF_SECONDS", "5"))
GITHUB_OUTBOX_BACKOFF_MAX_SECONDS = float(
    os.environ.get("GITHUB_OUTBOX_BACKOFF_MAX_SECONDS", "3600")
)
GITHUB_FAKE_PORT = int(os.environ.get("GITHUB_FAKE_PORT", "8765"))
CELERY_BEAT_SCHEDULE["github-outbox-reconcile"] = {
    "task": "proposals.github_outbox_reconcile",
    "schedule": float(os.environ.get("GITHUB_OUTBOX_RECONCILE_SECONDS", "30")),
}

CELERY_BEAT_SCHEDULE["proposals-notices-reconcile"] = {
    "task": "proposals.notices_reconcile",
    "schedule": float(os.environ.get("NOTICES_RECONCILE_SECONDS", "60")),
}

# Mail to followers (proposals/follows.py): printed on the console unless EMAIL_BACKEND says
# otherwise (e.g. django.core.mail.backends.smtp.EmailBackend with EMAIL_HOST and friends).
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = int(os.environ.get("EMAIL_PORT", "25"))
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", default=False)
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "marin-site <noreply@localhost>")

# Django REST framework and the OpenAPI schema.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticatedOrReadOnly"],
    "DEFAULT_PARSER_CLASSES": [
        "marin_site.parsers.SafeJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "plan-preview": os.environ.get("PLAN_PREVIEW_RATE", "60/min"),
        "verdict-check": os.environ.get("VERDICT_CHECK_RATE", "120/min"),
    },
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 25,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "marin_site.api.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "marin-site API",
    "DESCRIPTION": "Propose, review, run and publish the experiments of an open LLM project.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "ProposalStateEnum": "proposals.models.State",
        "RunStateEnum": "runs.models.RunState",
        "FailureKindEnum": "runs.models.FailureKind",
        "AlertKindEnum": "runs.alerts.models.AlertKind",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "marin_site.api_schema.document_refusals",
    ],
}

# Content-Security-Policy (django-csp): scripts, styles, fonts and data only from this site.
# Images in user-written markdown are shown only from MARKDOWN_IMAGE_HOSTS (others become
# links, proposals/markdown.py), so the policy names exactly those hosts.
MARKDOWN_IMAGE_HOSTS = env_list("MARKDOWN_IMAGE_HOSTS")
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:", *(f"https://{host}" for host in MARKDOWN_IMAGE_HOSTS)],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'", "https://github.com"],
        "frame-ancestors": ["'none'"],
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}

if not DEBUG:
    SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", default=True)
    CSRF_COOKIE_SECURE = env_bool("SECURE_COOKIES", default=True)
    SECURE_CONTENT_TYPE_NOSNIFF = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    X_FRAME_OPTIONS = "DENY"
    # HSTS on answers served over HTTPS (SecurityMiddleware sends it only on secure requests).
    SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", str(365 * 24 * 3600)))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
