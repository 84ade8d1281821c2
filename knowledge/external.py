"""``external-http`` knowledge bases: a remote search service answers
``POST {api_url}/search`` with ``{"results": [{"id", "content", "score", "metadata"}]}``.

The request carries ``Authorization: Bearer <key>`` (the key read from the base's allowed
environment variable) and ``{"query", "topK", "scoreThreshold", "namespace", "filter": {}}``;
it goes through the outbound guard. An HTTP error, a refused address or a malformed answer
raises :class:`ExternalFailed` naming what went wrong (never the key).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import httpx2

from knowledge.models import KnowledgeBase
from runtime import outbound, outbound_http
from runtime.outbound import OutboundRefused, ResponseTooLarge
from runtime.secrets import SecretNotAllowed, api_key_from_env, current_secret_rule, redact

TIMEOUT_SECONDS = 20.0
MAX_CONTENT_CHARS = 20_000
MAX_METADATA_KEYS = 50


class ExternalFailed(Exception):
    """The remote service could not be asked, or answered something unusable."""


@dataclass(frozen=True)
class ExternalResult:
    id: str
    content: str
    score: float
    metadata: dict[str, Any] = field(default_factory=dict)


def external_search(base: KnowledgeBase, query: str, top_k: int) -> list[ExternalResult]:
    """The service's results for ``query``, best first, at most ``top_k``, none under the
    base's ``score_threshold``."""
    try:
        key = api_key_from_env(base.api_key_env, rule=current_secret_rule())
    except SecretNotAllowed as exc:
        raise ExternalFailed(str(exc)) from None
    if base.api_key_env and key is None:
        raise ExternalFailed(f"the environment variable {base.api_key_env} is not set")
    url = base.api_url.rstrip("/") + "/search"
    headers = {"Authorization": f"Bearer {key.reveal()}"} if key is not None else {}
    body = {
        "query": query, "topK": top_k, "scoreThreshold": base.score_threshold,
        "namespace": base.namespace, "filter": {},
    }  # fmt: skip
    try:
        policy, http = outbound_http.shared_client()
        outbound.check_url(url, policy)
        response = http.post(url, json=body, headers=headers, timeout=TIMEOUT_SECONDS)
        if response.status_code >= 400:
            raise ExternalFailed(f"the service answered HTTP {response.status_code}")
        answer = response.json()
    except (OutboundRefused, ResponseTooLarge, httpx2.HTTPError) as exc:
        raise ExternalFailed(redact(f"{type(exc).__name__}: {exc}", key)[:500]) from None
    except ValueError:
        raise ExternalFailed("the answer is not JSON") from None
    results = parse_results(answer)
    kept = [result for result in results if result.score >= base.score_threshold]
    kept.sort(key=lambda result: -result.score)
    return kept[:top_k]


def parse_results(answer: Any) -> list[ExternalResult]:
    """The results of a service's answer, or :class:`ExternalFailed` saying what is wrong."""
    results = answer.get("results") if isinstance(answer, dict) else None
    if not isinstance(results, list):
        raise ExternalFailed('the answer has no "results" list')
    parsed: list[ExternalResult] = []
    for index, item in enumerate(results):
        if not isinstance(item, dict):
            raise ExternalFailed(f"results[{index}] is not an object")
        ident, content, score = item.get("id"), item.get("content"), item.get("score")
        metadata = item.get("metadata", {})
        if not isinstance(ident, (str, int)) or isinstance(ident, bool) or ident == "":
            raise ExternalFailed(f"results[{index}].id is not a string or a number")
        if not isinstance(content, str):
            raise ExternalFailed(f"results[{index}].content is not a string")
        if not isinstance(score, (int, float)) or isinstance(score, bool):
            raise ExternalFailed(f"results[{index}].score is not a number")
        if not math.isfinite(score):
            raise ExternalFailed(f"results[{index}].score is not finite")
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA_KEYS:
            raise ExternalFailed(f"results[{index}].metadata is not an object of a few keys")
        parsed.append(
            ExternalResult(str(ident)[:200], content[:MAX_CONTENT_CHARS], float(score), metadata)
        )
    return parsed
