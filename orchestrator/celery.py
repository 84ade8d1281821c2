"""The Celery app and every periodic schedule.

A Celery message is a wake-up call, never the work item: workers claim runs from the database,
so a lost message only delays a run and a duplicated one does nothing (see docs/worker.md).
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")

app = Celery("loopwright")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    task_acks_late=False,  # nudges are cheap and idempotent; the DB lease is what matters
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    task_default_queue="loops",
    task_routes={
        "loops.*": {"queue": "loops"},
        "connectors.*": {"queue": "loops"},
        "knowledge.*": {"queue": "loops"},
        "skillhub.*": {"queue": "skills"},
    },
    beat_schedule={
        "loops.reap": {
            "task": "loops.reap",
            "schedule": float(os.environ.get("LOOPWRIGHT_REAPER_INTERVAL_SECONDS", "5")),
            "options": {"expires": 30},
        },
        # One static tick; due times live in CronSchedule rows (docs/triggers.md), never ETAs.
        "loops.cron_tick": {
            "task": "loops.cron_tick",
            "schedule": float(os.environ.get("LOOPWRIGHT_CRON_TICK_SECONDS", "15")),
            "options": {"expires": 30},
        },
        # Spans of ended runs stored, exported and pruned (docs/observability.md).
        "loops.spans_sweep": {
            "task": "loops.spans_sweep",
            "schedule": float(os.environ.get("LOOPWRIGHT_SPAN_SWEEP_SECONDS", "15")),
            "options": {"expires": 60},
        },
        # Events of runs ended past LOOPWRIGHT_EVENT_RETENTION_DAYS (docs/operations.md).
        "loops.events_prune": {
            "task": "loops.events_prune",
            "schedule": float(os.environ.get("LOOPWRIGHT_EVENT_PRUNE_SECONDS", "600")),
            "options": {"expires": 300},
        },
        # Skill executions whose sandbox worker died go back to the queue (docs/skills.md).
        "skillhub.recover": {
            "task": "skillhub.recover",
            "schedule": float(os.environ.get("LOOPWRIGHT_SKILL_POLLER_INTERVAL_SECONDS", "10")),
            "options": {"expires": 30, "queue": "skills"},
        },
    },
)
if app.conf.broker_url and str(app.conf.broker_url).startswith("filesystem://"):
    # The filesystem transport has no fan-out exchange, so remote control cannot work on it.
    app.conf.worker_enable_remote_control = False
app.autodiscover_tasks()
