"""One guarded synchronous HTTP client per process for the knowledge app's outbound calls
(embeddings, external providers): building a client costs more than a loopback request (its
TLS context), so it is made once per outbound policy and shared by threads."""

from __future__ import annotations

import threading

import httpx2

from runtime import outbound, outbound_http
from runtime.outbound import OutboundPolicy

TIMEOUT_SECONDS = 30.0
_lock = threading.Lock()
_shared: tuple[OutboundPolicy, httpx2.Client] | None = None


def guarded_client() -> tuple[OutboundPolicy, httpx2.Client]:
    """The process-wide policy now and a client whose every connection it checks."""
    global _shared
    policy = outbound.current_policy()
    with _lock:
        if _shared is None or _shared[0] is not policy:
            if _shared is not None:
                _shared[1].close()
            _shared = (policy, outbound_http.client(policy, timeout=TIMEOUT_SECONDS))
        return _shared
