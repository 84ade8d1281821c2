"""Whether a role's network reaches a service a tool calls: the harness's
``isolation.networkAccess`` and ``allowedHosts`` apply to MCP and A2A calls and to external
knowledge bases as to the sandbox (docs/interop.md, docs/knowledge.md). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

from runtime.outbound import host_listed


def network_refusal(urls: Iterable[str], network: str, hosts: Sequence[str]) -> str:
    """Why a role granted ``network`` (``deny`` / ``restricted`` / ``allow``) and ``hosts`` may
    not reach every one of ``urls``; "" when it may."""
    if network == "allow":
        return ""
    if network != "restricted":
        return "the role's harness gives it no network (isolation.networkAccess is deny)"
    for url in urls:
        host = (urlsplit(url).hostname or "").lower()
        if "*" not in hosts and not host_listed(host, hosts):
            return (
                "the role's network is restricted and "
                f"{host or url!r} is not in its isolation.allowedHosts"
            )
    return ""
