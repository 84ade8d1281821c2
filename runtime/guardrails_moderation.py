"""The pluggable guardrail: any OpenAI-compatible ``POST /v1/moderations`` endpoint.

One call per checked text, through the outbound guard (:mod:`runtime.outbound_http`: the URL's
rules, then every connection's address), with the rule's timeout over the whole exchange. The
key is read from the environment at call time under the secret rule (:mod:`runtime.secrets`)
and scrubbed from every error text. Any failure raises :class:`ModerationUnavailable`, which
the caller turns into a fail-open or fail-closed decision.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2

from runtime import model_pool, outbound, outbound_http
from runtime.guardrails_config import ModerationRule
from runtime.outbound import OutboundPolicy
from runtime.secrets import Secret, SecretNotAllowed, api_key_from_env, redact

#: Bytes of an error body quoted in a failure's message.
ERROR_EXCERPT = 200


class ModerationUnavailable(Exception):
    """The moderation endpoint could not give a verdict; the message says why (redacted)."""


@dataclass(frozen=True)
class ModerationAnswer:
    """What the endpoint said: ``flagged`` by any result, and the categories it flagged."""

    flagged: bool
    categories: tuple[str, ...]

    def blocks(self, rule: ModerationRule) -> tuple[bool, str]:
        """(whether ``rule`` blocks on this answer, the reason)."""
        named = ", ".join(self.categories) or "no category named"
        if not self.flagged:
            return False, "not flagged by the moderation endpoint"
        if not rule.categories:
            return True, f"flagged by the moderation endpoint: {named}"
        hits = [c for c in self.categories if c in rule.categories]
        if hits:
            return True, f"flagged by the moderation endpoint: {', '.join(hits)}"
        return False, f"flagged for {named}, none of the rule's categories"


def parse_moderation(body: Any) -> ModerationAnswer:
    """The OpenAI moderation answer ``{"results": [{"flagged", "categories": {name: bool}}]}``;
    ValueError for anything else."""
    results = body.get("results") if isinstance(body, dict) else None
    if not isinstance(results, list) or not results:
        raise ValueError("the answer has no results")
    flagged = False
    categories: list[str] = []
    for result in results:
        if not isinstance(result, dict) or not isinstance(result.get("flagged"), bool):
            raise ValueError("a result has no boolean 'flagged'")
        flagged = flagged or result["flagged"]
        named = result.get("categories") or {}
        if not isinstance(named, dict):
            raise ValueError("a result's 'categories' is not an object")
        categories.extend(str(k) for k, v in named.items() if v is True and k not in categories)
    return ModerationAnswer(flagged, tuple(categories))


@asynccontextmanager
async def _client(
    http: httpx2.AsyncClient | None, policy: OutboundPolicy, timeout: float
) -> AsyncIterator[httpx2.AsyncClient]:
    if http is not None:
        yield http
        return
    verify = model_pool.ssl_context()
    async with outbound_http.async_client(policy, verify=verify, total_timeout=timeout) as client:
        yield client


async def moderate(
    rule: ModerationRule,
    text: str,
    *,
    http: httpx2.AsyncClient | None = None,
    policy: OutboundPolicy | None = None,
    environ: Mapping[str, str] | None = None,
) -> ModerationAnswer:
    """Ask ``rule``'s endpoint about ``text``. ``http``: a client to use (it should be one of
    :func:`runtime.outbound_http.async_client`; by default one is made for the call);
    ``policy``: the outbound policy (default the process-wide one). Raises
    :class:`ModerationUnavailable`."""
    chosen = policy or outbound.current_policy()
    timeout = rule.timeout_ms / 1000
    key: Secret | None = None
    try:
        key = api_key_from_env(rule.api_key_env, environ)
        if rule.api_key_env and key is None:
            raise ModerationUnavailable(f"the environment variable {rule.api_key_env} is not set")
        outbound.check_url_cached(rule.url, chosen)
        body: dict[str, Any] = {"input": text}
        if rule.model:
            body["model"] = rule.model
        headers = {"Authorization": f"Bearer {key.reveal()}"} if key else {}
        async with asyncio.timeout(timeout), _client(http, chosen, timeout) as client:
            response = await client.post(
                rule.url, json=body, headers=headers, timeout=httpx2.Timeout(timeout)
            )
            raw = await response.aread()
        if response.status_code >= 300:
            excerpt = raw[:ERROR_EXCERPT].decode(errors="replace")
            raise ModerationUnavailable(
                redact(f"the endpoint answered {response.status_code}: {excerpt}", key)
            )
        return parse_moderation(json.loads(raw))
    except ModerationUnavailable:
        raise
    except (httpx2.TimeoutException, TimeoutError):
        raise ModerationUnavailable(f"no answer within {rule.timeout_ms} ms") from None
    except (SecretNotAllowed, outbound.OutboundRefused, outbound.ResponseTooLarge) as exc:
        raise ModerationUnavailable(redact(str(exc), key)) from None
    except httpx2.HTTPError as exc:
        raise ModerationUnavailable(redact(f"{type(exc).__name__}: {exc}", key)) from None
    except ValueError as exc:  # JSON, or not the moderation shape
        raise ModerationUnavailable(redact(f"unreadable answer: {exc}", key)) from None
