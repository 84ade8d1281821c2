"""The command line and environment of a Deno program: Deno's permissions, a second wall.

bubblewrap is the wall that holds (docs/sandbox.md); inside it, ``deno run`` is started with
every permission denied but what a skill needs, and never a prompt:

- read the program and the work and temporary directories, write the last two;
- the environment (the runner builds it from nothing, as for Python and Node.js);
- the network only as the run's network mode allows: none for ``deny``; any host for
  ``allow`` (the host network); for ``restricted``, the in-sandbox forwarder of the egress proxy
  and the proxy's allowlisted names (Deno checks a ``fetch`` against the destination, not the
  proxy it goes through; the proxy still decides, and nothing else is reachable there);
- no subprocesses, FFI, system information or remote/npm/JSR imports, no config, lock or
  ``package.json`` discovery, no type checking (types are stripped).

There is no production path to widen these: no request field or setting adds a permission.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from sandbox.egress import PROXY_PORT
from sandbox.types import DENO_RESERVED_ADDRESS_SPACE, MiB, Network

#: A ``--allow-net`` entry Deno parses: ``*`` handled apart, ``*.domain``, a name or IPv4 with an
#: optional port. Anything else (an IPv6 literal, a comma) is left out: Deno then refuses it,
#: the safe direction.
_NET_ENTRY = re.compile(r"^(\*\.)?[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?$")


def deno_net_flags(network: Network, egress: bool, hosts: Iterable[str]) -> list[str]:
    """Deno's network permission for a run's network mode (``egress``: behind the proxy)."""
    if network == "allow":
        return ["--allow-net"]
    if network != "restricted" or not egress:
        return []
    names = [h.strip().lower().rstrip(".") for h in hosts]
    if "*" in names:
        return ["--allow-net"]
    entries = [f"127.0.0.1:{PROXY_PORT}", *(n for n in names if _NET_ENTRY.match(n))]
    return [f"--allow-net={','.join(dict.fromkeys(entries))}"]


def deno_argv(
    deno_path: str,
    code_path: str,
    *,
    readable: Iterable[str],
    writable: Iterable[str],
    net: list[str],
    address_space: int,
) -> list[str]:
    """``deno run`` with the permissions above; ``readable``/``writable`` hold no comma
    (runner-made paths)."""
    heap_mib = max(64, (address_space - DENO_RESERVED_ADDRESS_SPACE) // MiB)
    return [
        deno_path,
        "run",
        "--no-prompt",
        "--no-config",
        "--no-lock",
        "--no-remote",
        "--no-npm",
        "--cached-only",
        "--no-check",
        f"--allow-read={','.join([code_path, *readable])}",
        f"--allow-write={','.join(writable)}",
        "--allow-env",
        *net,
        f"--v8-flags=--max-old-space-size={heap_mib}",
        code_path,
    ]


def deno_env(tmpdir: str) -> dict[str, str]:
    """Set after the request's own variables (whose ``DENO_*`` names are reserved)."""
    return {
        # Deno's module and compile cache: on the run's private temporary directory.
        "DENO_DIR": f"{tmpdir}/.deno",
        "DENO_NO_UPDATE_CHECK": "1",
        "DENO_NO_PROMPT": "1",
        "DENO_NO_PACKAGE_JSON": "1",
        # Deno colours its own error messages even on a pipe.
        "NO_COLOR": "1",
    }
