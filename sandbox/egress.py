"""``network="restricted"``: the sandbox side of the allowlisting egress proxy.

The sandbox keeps its own, empty network namespace (only loopback). The host's proxy
(``runtime.egress_proxy``, which decides what may be reached) listens on a Unix socket; the
runner binds that socket into the sandbox at :data:`SANDBOX_EGRESS_SOCKET` and starts the program
through :data:`FORWARDER_SOURCE`: a small Python program that listens on
``127.0.0.1:`` :data:`PROXY_PORT` *inside* the sandbox, forks a relay that copies each TCP
connection to the socket, and execs the real program with ``HTTP_PROXY``/``HTTPS_PROXY`` (and
the lower-case forms) pointing at it. Nothing else leaves the namespace: a program that ignores
the proxy variables reaches nothing, and one that uses them reaches only what the host proxy
allows. The relay is one process with one thread (``selectors``), so it costs one task of the
sandbox's ``max_processes``.
"""

from __future__ import annotations

from collections.abc import Mapping

#: Where the proxy's socket is bound inside the sandbox.
SANDBOX_EGRESS_SOCKET = "/run/loopwright-egress.sock"
#: The forwarder's port on the sandbox's own loopback (a private namespace: no clash).
PROXY_PORT = 3128
FORWARDER_NAME = "egress.py"

PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"


def proxy_env() -> Mapping[str, str]:
    """The variables that send HTTP clients (curl, pip, requests, urllib, git) to the proxy."""
    return {
        "HTTP_PROXY": PROXY_URL,
        "HTTPS_PROXY": PROXY_URL,
        "http_proxy": PROXY_URL,
        "https_proxy": PROXY_URL,
        "ALL_PROXY": PROXY_URL,
        "NO_PROXY": "",
        "no_proxy": "",
    }


#: Run as ``python3 -I -S -B egress.py <program argv...>`` inside the sandbox.
FORWARDER_SOURCE = r"""
import os, selectors, socket, sys

SOCK = %(socket)r
PORT = %(port)d

listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", PORT))
listener.listen(64)

if os.fork() == 0:
    sel = selectors.DefaultSelector()
    listener.setblocking(False)
    sel.register(listener, selectors.EVENT_READ, None)
    peers = {}
    ended = set()

    def close(sock):
        for s in (sock, peers.pop(sock, None)):
            if s is None:
                continue
            peers.pop(s, None)
            ended.discard(s)
            try:
                sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()

    while True:
        for key, _ in sel.select():
            sock = key.fileobj
            if sock is listener:
                try:
                    client, _ = listener.accept()
                except OSError:
                    continue
                upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    upstream.connect(SOCK)
                except OSError:
                    client.close()
                    upstream.close()
                    continue
                for s in (client, upstream):
                    s.setblocking(False)
                peers[client], peers[upstream] = upstream, client
                sel.register(client, selectors.EVENT_READ, None)
                sel.register(upstream, selectors.EVENT_READ, None)
                continue
            peer = peers.get(sock)
            if peer is None:
                continue
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                close(sock)
                continue
            if not data:
                # Half-close: pass the end on, keep reading the other way until it ends too.
                sel.unregister(sock)
                ended.add(sock)
                try:
                    peer.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                if peer in ended:
                    close(sock)
                continue
            try:
                peer.setblocking(True)
                peer.sendall(data)
                peer.setblocking(False)
            except OSError:
                close(sock)

listener.close()
os.execv(sys.argv[1], sys.argv[1:])
"""


def forwarder_source() -> str:
    return FORWARDER_SOURCE % {"socket": SANDBOX_EGRESS_SOCKET, "port": PROXY_PORT}
