"""The harness network rule for connector calls (``runtime.reach``), pure."""

from __future__ import annotations

import pytest

from runtime.reach import network_refusal

URLS = ["https://mcp.example.com/mcp", "https://agents.example.org/a2a"]


@pytest.mark.parametrize(
    ("network", "hosts", "refused"),
    [
        ("allow", [], ""),
        ("deny", ["*"], "isolation.networkAccess is deny"),
        ("bogus", ["*"], "isolation.networkAccess is deny"),  # anything unknown denies
        ("restricted", [], "'mcp.example.com' is not in its isolation.allowedHosts"),
        ("restricted", ["*"], ""),
        ("restricted", ["mcp.example.com"], "'agents.example.org' is not in"),
        ("restricted", ["*.example.com", "agents.example.org"], ""),
        ("restricted", ["example.com", "*.example.org"], "'mcp.example.com' is not in"),
    ],
)
def test_every_url_must_be_reachable(network: str, hosts: list[str], refused: str) -> None:
    reason = network_refusal(URLS, network, hosts)
    assert (refused in reason) if refused else reason == ""
