"""The host's metrics folder: the counts of processes that are gone are folded into archive files
without changing any sum a scrape shows; ``/metrics`` asks for the bearer token once one is set.
The processes are real (``python`` in prometheus_client's multiprocess mode)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.test import Client
from pytest_django.fixtures import Settings as SettingsWrapper

from orchestrator.metrics_store import HostCollector, dead_processes_fold
from tests.observability.scrape import parsed, value

_COUNTING = textwrap.dedent(
    """
    import os, signal, sys
    from prometheus_client import CollectorRegistry, Counter, Histogram
    registry = CollectorRegistry()
    done = Counter("demo_done", "d", ["kind"], registry=registry)
    took = Histogram("demo_took_seconds", "t", buckets=(1.0,), registry=registry)
    done.labels(kind="a").inc(int(sys.argv[1]))
    took.observe(0.5)
    print("counted", flush=True)
    if sys.argv[2] == "die":
        os.kill(os.getpid(), signal.SIGKILL)  # no exit handler runs
    sys.stdin.read()
    """
)


def _counting(folder: Path, amount: int, *, die: bool) -> subprocess.Popen[str]:
    """A process that counted ``amount``: killed already (``die``), else waiting for stdin."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _COUNTING, str(amount), "die" if die else "live"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    if die:
        out, _ = proc.communicate(timeout=30)
        assert (out.strip(), proc.returncode) == ("counted", -signal.SIGKILL)
    else:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "counted"
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.communicate(timeout=30)


def _sums(folder: Path) -> tuple[float, float]:
    """(demo_done_total{kind=a}, demo_took_seconds_count) summed over the folder's files."""
    found = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in HostCollector(folder).collect()
        for sample in metric.samples
    }
    return found[("demo_done_total", (("kind", "a"),))], found[("demo_took_seconds_count", ())]


def _files(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.glob("*.db"))


def test_the_counts_of_gone_processes_are_archived_and_every_sum_stays_the_same(
    tmp_path: Path,
) -> None:
    alive = _counting(tmp_path, 2, die=False)
    try:
        dead = _counting(tmp_path, 3, die=True)
        assert _sums(tmp_path) == (5, 2)
        assert dead_processes_fold(tmp_path) == 2  # its counter and its histogram file
        assert _sums(tmp_path) == (5, 2)
        assert f"counter_{dead.pid}.db" not in _files(tmp_path)
        assert f"counter_{alive.pid}.db" in _files(tmp_path)

        _counting(tmp_path, 4, die=True)
        dead_processes_fold(tmp_path)
        assert _sums(tmp_path) == (9, 3)  # the archive adds up, it is not overwritten
    finally:
        _stop(alive)
    dead_processes_fold(tmp_path)
    assert _files(tmp_path) == ["counter_archive.db", "histogram_archive.db"]
    assert _sums(tmp_path) == (9, 3)


@pytest.mark.django_db
def test_metrics_answer_only_the_bearer_token_once_one_is_set(settings: SettingsWrapper) -> None:
    settings.METRICS_TOKEN = "scrape-secret"
    client = Client()
    assert client.get("/metrics").status_code == 401
    wrong = client.get("/metrics", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert "scrape-secret" not in wrong.content.decode()
    right = client.get("/metrics", headers={"Authorization": "Bearer scrape-secret"})
    assert right.status_code == 200
    assert value(parsed(right.content.decode()), "loopwright_approvals_pending") == 0


@pytest.mark.django_db
def test_the_html_metrics_page_moved_to_a_ui_path_and_metrics_is_prometheus_text(
    settings: SettingsWrapper,
) -> None:
    settings.METRICS_TOKEN = ""
    answer = Client().get("/metrics", headers={"Accept": "text/html"})
    assert answer["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b"<html" not in answer.content
    page = Client().get("/ui/metrics")
    assert page.status_code == 302 and page["Location"].startswith("/login")
