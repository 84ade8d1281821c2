"""Scraping ``/metrics`` the way Prometheus does, parsed with ``prometheus_client``'s parser."""

from __future__ import annotations

import urllib.request
from collections.abc import Mapping

from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

#: (sample name, sorted label pairs) → value.
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parsed(text: str) -> Samples:
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def web_scrape(**headers: str) -> Samples:
    """``GET /metrics`` of the web application (in this process), parsed."""
    response = Client().get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return parsed(response.content.decode())


def port_scrape(port: int) -> Samples:
    """A worker's own metrics port, parsed."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return parsed(answer.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value, 0 when it is not there (yet)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def names(samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float]) -> set[str]:
    return {name for name, _ in samples}
