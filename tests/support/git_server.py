"""A real Git server on loopback: bare repositories over git's "dumb" HTTP protocol.

``GitHttpServer`` serves a directory of bare repositories (``<name>.git``) with Python's HTTP
server in a background thread and records every request path. ``publish(work, name)`` pushes a
working repository's branch into ``<name>.git`` and runs ``git update-server-info`` (what the
dumb protocol reads), and returns the clone URL. ``redirect`` makes a path answer ``302`` to
another URL (redirects must not be followed).
"""

from __future__ import annotations

import subprocess
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.email=t@example.invalid", "-c", "user.name=t", *args],
        cwd=repo, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


class GitHttpServer:
    def __init__(self, root: Path, host: str = "127.0.0.1") -> None:
        self.root = root
        self.requests: list[str] = []
        self.redirects: dict[str, str] = {}
        server = self

        class Handler(SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(server.root), **kwargs)

            def do_GET(self) -> None:
                server.requests.append(self.path)
                for prefix, location in server.redirects.items():
                    if self.path.startswith(prefix):
                        self.send_response(302)
                        self.send_header("Location", location)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                super().do_GET()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> GitHttpServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)

    def url(self, name: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/{name}.git"

    def publish(self, work: Path, name: str, branch: str = "main") -> str:
        """Push ``work``'s ``branch`` to ``<name>.git`` (made on first use); its URL."""
        bare = self.root / f"{name}.git"
        if not bare.exists():
            subprocess.run(
                ["git", "init", "--quiet", "--bare", "-b", branch, str(bare)], check=True
            )
        git(work, "push", "--quiet", "--force", str(bare), f"{branch}:{branch}")
        git(bare, "update-server-info")
        return self.url(name)
