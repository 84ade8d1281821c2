"""Event intake: who may deliver an event, signed webhooks, idempotent retries and fan-out.

``POST /api/v1/events/{key}`` starts one run of every event pattern subscribed to ``key``. The
caller is an operator's API token, or a webhook signing the raw body with the key's secret::

    X-Loopwright-Timestamp: <unix seconds>
    X-Loopwright-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>.<raw body>")>

A signature is compared in constant time; a timestamp further than the key's tolerance from the
server's clock is refused (an old capture cannot be replayed), and so is a second use of a
signature already accepted. Unknown keys look exactly like bad signatures to a signed caller.

An ``Idempotency-Key`` makes a retry safe: the delivery row is unique per (event key,
idempotency key) and holds the response, which a retry gets back instead of new runs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework import status

from loops.models import EventDelivery, EventKey, LoopPattern, TriggerType
from loops.services.runs import run_trigger
from loops.triggers.guards import trigger_refusal
from orchestrator.errors import Conflict, DomainError, InvalidInput, NotFound

SIGNATURE_SCHEME = "sha256="
MAX_IDEMPOTENCY_KEY = 200
TEMPLATE_ERROR = "template_error"
# Compared against when the key is unknown, so that an unknown key costs the same as a bad
# signature and answers the same way.
_NO_SECRET = secrets.token_hex(32)


class EventAuthFailed(DomainError):
    """A signed delivery that is not accepted: bad or missing signature, stale timestamp,
    unknown key, or a replay. Always 401 with one of a few fixed messages."""

    status_code = status.HTTP_401_UNAUTHORIZED
    problem_type = "authentication-failed"
    title = "Authentication failed"


BAD_SIGNATURE = (
    "The signature does not match. Sign '<timestamp>.<raw body>' with HMAC-SHA256 and the "
    "event key's secret, and send 'X-Loopwright-Signature: sha256=<hex>'."
)


def secret_generate() -> str:
    return secrets.token_hex(32)


def signature_compute(secret: str, timestamp: str, body: bytes) -> str:
    """The hex HMAC-SHA256 a sender puts after ``sha256=``."""
    message = timestamp.encode("ascii") + b"." + body
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def _parse_timestamp(timestamp: str | None) -> int:
    if not timestamp or not timestamp.strip().isdigit() or len(timestamp.strip()) > 12:
        raise EventAuthFailed("X-Loopwright-Timestamp must be the signing time in unix seconds.")
    return int(timestamp.strip())


def _parse_signature(header: str | None) -> str:
    value = (header or "").strip()
    if not value.lower().startswith(SIGNATURE_SCHEME):
        raise EventAuthFailed(BAD_SIGNATURE)
    return value[len(SIGNATURE_SCHEME) :].strip().lower()


def event_signature_verify(
    *, event_key: str, timestamp: str | None, signature: str | None, body: bytes, now: datetime
) -> str:
    """Check a signed delivery; return the accepted signature (hex) or raise EventAuthFailed.

    The signature is checked before the timestamp, so only a holder of the secret learns that
    the key exists and what the tolerance is.
    """
    sent_at = _parse_timestamp(timestamp)
    sent = _parse_signature(signature)
    key = EventKey.objects.filter(key=event_key, enabled=True).first()
    expected = signature_compute(key.secret if key else _NO_SECRET, str(timestamp).strip(), body)
    if not hmac.compare_digest(expected, sent) or key is None:
        raise EventAuthFailed(BAD_SIGNATURE)
    skew = abs(now.timestamp() - sent_at)
    if skew > key.tolerance_seconds:
        raise EventAuthFailed(
            f"The signature timestamp is {int(skew)} s away from the server's clock (tolerance "
            f"{key.tolerance_seconds} s); refused as a possible replay. Sign each delivery anew."
        )
    return expected


def event_key_known_for_token(event_key: str) -> None:
    """For an authenticated operator: 404 for a key nobody uses, 409 for a disabled one."""
    key = EventKey.objects.filter(key=event_key).first()
    if key is not None and not key.enabled:
        raise Conflict(f"Event key {event_key!r} is disabled.")
    if key is None and not LoopPattern.objects.filter(event_key=event_key).exists():
        raise NotFound(f"No event key {event_key!r} and no pattern subscribed to it.")


def payload_hash(payload: dict[str, Any]) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def inputs_of(payload: dict[str, Any]) -> dict[str, Any]:
    inputs = payload.get("inputs")
    if inputs is None:
        return {}
    if not isinstance(inputs, dict):
        raise InvalidInput(
            "The payload's 'inputs' must be a JSON object.",
            errors=[{"pointer": "/inputs", "detail": "must be an object", "code": "invalid"}],
        )
    return inputs


@dataclass(frozen=True)
class DeliveryOutcome:
    """The response body, and whether it is the stored answer to an earlier delivery."""

    body: dict[str, Any]
    replayed: bool


def event_deliver(
    *,
    event_key: str,
    payload: dict[str, Any],
    principal: str,
    idempotency_key: str | None = None,
    signature: str | None = None,
) -> DeliveryOutcome:
    """Start a run of every event pattern subscribed to ``event_key``, once per delivery.

    With an ``idempotency_key`` already used for this event key by the same principal and the
    same payload, returns the first delivery's response and starts nothing; another payload or
    another principal is a 409. A signature already accepted is refused (401) unless it comes
    with the idempotency key it was first sent with.
    """
    digest = payload_hash(payload)
    inputs = inputs_of(payload)
    prior = _prior(event_key, idempotency_key, signature)
    if prior is not None:
        return _replay(prior, principal, digest, idempotency_key)
    try:
        return _deliver(event_key, payload, inputs, principal, idempotency_key, signature, digest)
    except IntegrityError:
        # A concurrent delivery with the same idempotency key or signature committed first.
        prior = _prior(event_key, idempotency_key, signature)
        if prior is None:
            raise
        return _replay(prior, principal, digest, idempotency_key)


def _prior(
    event_key: str, idempotency_key: str | None, signature: str | None
) -> EventDelivery | None:
    deliveries = EventDelivery.objects.filter(event_key=event_key)
    if idempotency_key is not None:
        found = deliveries.filter(idempotency_key=idempotency_key).first()
        if found is not None:
            return found
    if signature is not None:
        return deliveries.filter(signature=signature).first()
    return None


def _replay(
    prior: EventDelivery, principal: str, digest: str, idempotency_key: str | None
) -> DeliveryOutcome:
    if idempotency_key is None or prior.idempotency_key != idempotency_key:
        raise EventAuthFailed(
            "This signed delivery was already accepted; a replay starts nothing. Sign each "
            "delivery anew, or retry with the same Idempotency-Key to get the first answer."
        )
    if prior.principal != principal:
        raise Conflict("This Idempotency-Key was used by another sender for this event key.")
    if prior.payload_hash != digest:
        raise Conflict(
            "This Idempotency-Key was already used with a different payload; use a new key "
            "for a new event."
        )
    return DeliveryOutcome(body=prior.response, replayed=True)


@transaction.atomic
def _deliver(
    event_key: str,
    payload: dict[str, Any],
    inputs: dict[str, Any],
    principal: str,
    idempotency_key: str | None,
    signature: str | None,
    digest: str,
) -> DeliveryOutcome:
    # The row goes in first: its unique constraints make a concurrent duplicate wait for this
    # transaction and then fail, instead of starting its own runs.
    delivery = EventDelivery.objects.create(
        event_key=event_key,
        idempotency_key=idempotency_key,
        principal=principal,
        payload_hash=digest,
        signature=signature,
    )
    runs, refused = _fan_out(event_key, payload, inputs, principal, str(delivery.id))
    invalid = [r for r in refused if r["code"] == TEMPLATE_ERROR]
    if not runs and invalid and len(invalid) == len(refused):
        raise InvalidInput(
            "The event could not start any run: "
            + "; ".join(f"{r['pattern']}: {r['reason']}" for r in invalid),
            errors=[
                {"pointer": "/", "detail": f"{r['pattern']}: {r['reason']}", "code": r["code"]}
                for r in invalid
            ],
        )
    body = {
        "delivery_id": str(delivery.id),
        "event_key": event_key,
        "received_at": timezone.now().isoformat().replace("+00:00", "Z"),
        "runs": runs,
        "refused": refused,
    }
    delivery.run_ids = [r["id"] for r in runs]
    delivery.response = body
    delivery.save(update_fields=["run_ids", "response"])
    return DeliveryOutcome(body=body, replayed=False)


def _code(exc: DomainError) -> str:
    """``template_error`` when the goal template failed on this payload, else ``refused``."""
    codes = {str(e.get("code")) for e in exc.extra.get("errors", []) if isinstance(e, dict)}
    return TEMPLATE_ERROR if codes & {"template_render", "template_syntax"} else "refused"


def _fan_out(
    event_key: str, payload: dict[str, Any], inputs: dict[str, Any], principal: str, ref: str
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """One run per subscribed pattern, each in its own savepoint: one refusal fails no other."""
    runs: list[dict[str, Any]] = []
    refused: list[dict[str, str]] = []
    patterns = LoopPattern.objects.filter(trigger_type=TriggerType.EVENT, event_key=event_key)
    for pattern in patterns.order_by("key"):
        reason = trigger_refusal(pattern)
        if reason:
            refused.append({"pattern": pattern.key, "reason": reason, "code": "refused"})
            continue
        try:
            with transaction.atomic():  # one pattern's refusal must not undo the others
                run = run_trigger(
                    pattern=pattern,
                    actor=principal,
                    inputs=inputs,
                    trigger_type=TriggerType.EVENT,
                    trigger_ref=ref,
                    event=payload,
                )
        except DomainError as exc:
            refused.append({"pattern": pattern.key, "reason": exc.detail, "code": _code(exc)})
            continue
        runs.append({"id": str(run.id), "pattern": pattern.key, "status": run.status})
    return runs, refused


@transaction.atomic
def event_key_create(
    *,
    key: str,
    actor: str,
    description: str = "",
    tolerance_seconds: int = 300,
    enabled: bool = True,
) -> tuple[EventKey, str]:
    """Create an event key; returns it with its secret, which is never shown again."""
    if EventKey.objects.filter(key=key).exists():
        raise InvalidInput(
            f"An event key {key!r} already exists.",
            errors=[{"pointer": "/key", "detail": "already exists", "code": "unique"}],
        )
    secret = secret_generate()
    row = EventKey.objects.create(
        key=key,
        description=description,
        secret=secret,
        tolerance_seconds=tolerance_seconds,
        enabled=enabled,
        created_by=actor,
    )
    return row, secret


@transaction.atomic
def event_key_rotate(*, event_key: EventKey) -> tuple[EventKey, str]:
    """Replace the secret at once: deliveries signed with the old one are refused from now."""
    locked = EventKey.objects.select_for_update().get(pk=event_key.pk)
    locked.secret = secret_generate()
    locked.rotated_at = timezone.now()
    locked.save(update_fields=["secret", "rotated_at"])
    return locked, locked.secret


EVENT_KEY_FIELDS = ("description", "tolerance_seconds", "enabled")


@transaction.atomic
def event_key_update(*, event_key: EventKey, **fields: Any) -> EventKey:
    locked = EventKey.objects.select_for_update().get(pk=event_key.pk)
    changed = [name for name in EVENT_KEY_FIELDS if name in fields]
    for name in changed:
        setattr(locked, name, fields[name])
    if changed:
        locked.save(update_fields=changed)
    return locked


def event_key_delete(*, event_key: EventKey) -> None:
    """Remove a key: signed deliveries to it are refused from now; its deliveries stay."""
    EventKey.objects.filter(pk=event_key.pk).delete()
