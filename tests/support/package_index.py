"""A local PEP 503 simple index and a local npm registry on loopback HTTP, serving wheels and
tarballs built here (no internet): the package environments' tests install from them with the
real pip and npm. Each server counts the files it served."""

from __future__ import annotations

import base64
import collections
import hashlib
import io
import json
import re
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def wheel(name: str, version: str, files: dict[str, bytes], requires: tuple[str, ...] = ()
          ) -> tuple[str, bytes]:  # fmt: skip
    """A valid pure-Python wheel (METADATA, WHEEL, RECORD and ``files``): (filename, bytes)."""
    dist = f"{name.replace('-', '_')}-{version}"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    content = {
        **files,
        f"{dist}.dist-info/METADATA": meta.encode(),
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: loopwright-tests\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in content.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    content[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in content.items():
            zf.writestr(path, data)
    return f"{dist}-py3-none-any.whl", buffer.getvalue()


def npm_tarball(name: str, version: str, files: dict[str, bytes]) -> bytes:
    """An npm package tarball: ``package/package.json`` and ``files`` under ``package/``."""
    manifest = json.dumps({"name": name, "version": version, "main": "index.js"}).encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path, data in {"package.json": manifest, **files}.items():
            info = tarfile.TarInfo(f"package/{path}")
            info.size, info.mode, info.mtime = len(data), 0o644, 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class PackageServer(ThreadingHTTPServer):
    """Both kinds of index: ``/simple/<name>/`` + ``/files/<wheel>`` (pip) and ``/<name>`` +
    ``/tarballs/<file>`` (npm). ``delay`` stalls every answer (a hanging index)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.wheels: dict[str, dict[str, bytes]] = collections.defaultdict(dict)
        self.npm: dict[str, dict[str, tuple[str, bytes]]] = collections.defaultdict(dict)
        self.latest: dict[str, str] = {}
        self.served: collections.Counter[str] = collections.Counter()
        self.delay = 0.0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def add_wheel(self, name: str, version: str, files: dict[str, bytes],
                  requires: tuple[str, ...] = ()) -> None:  # fmt: skip
        filename, data = wheel(name, version, files, requires)
        self.wheels[_canonical(name)][filename] = data

    def add_npm(self, name: str, version: str, files: dict[str, bytes]) -> None:
        filename = f"{name.replace('/', '-').lstrip('@')}-{version}.tgz"
        self.npm[name][version] = (filename, npm_tarball(name, version, files))
        self.latest[name] = version

    def packument(self, name: str) -> dict[str, Any] | None:
        versions = self.npm.get(name)
        if not versions:
            return None
        out: dict[str, Any] = {}
        for version, (filename, data) in versions.items():
            integrity = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
            out[version] = {
                "name": name, "version": version,
                "dist": {"tarball": f"{self.url}/tarballs/{filename}",
                         "shasum": hashlib.sha1(data).hexdigest(),  # noqa: S324 (npm's field)
                         "integrity": integrity},
            }  # fmt: skip
        return {"name": name, "dist-tags": {"latest": self.latest[name]}, "versions": out}

    def file(self, path: str) -> bytes | None:
        if path.startswith("/files/"):
            filename = path.removeprefix("/files/")
            for files in self.wheels.values():
                if filename in files:
                    return files[filename]
        if path.startswith("/tarballs/"):
            filename = path.removeprefix("/tarballs/")
            for versions in self.npm.values():
                for name, data in versions.values():
                    if name == filename:
                        return data
        return None


class _Handler(BaseHTTPRequestHandler):
    server: PackageServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        time.sleep(self.server.delay)
        path = self.path.split("?", 1)[0]
        if path.startswith("/simple/"):
            return self._simple(path.removeprefix("/simple/").strip("/"))
        data = self.server.file(path)
        if data is not None:
            with self.server.lock:
                self.server.served[path.rsplit("/", 1)[-1]] += 1
            return self._send(200, "application/octet-stream", data)
        name = path.lstrip("/").replace("%2f", "/").replace("%2F", "/")
        doc = self.server.packument(name)
        if doc is None:
            return self._send(404, "application/json", b'{"error":"Not found"}')
        return self._send(200, "application/json", json.dumps(doc).encode())

    def _simple(self, name: str) -> None:
        files = self.server.wheels.get(_canonical(name))
        if not files:
            return self._send(404, "text/html", b"<html><body>Not Found</body></html>")
        links = "".join(
            f'<a href="/files/{f}#sha256={hashlib.sha256(d).hexdigest()}">{f}</a><br/>'
            for f, d in files.items()
        )
        body = f"<!DOCTYPE html><html><body>{links}</body></html>".encode()
        return self._send(200, "text/html", body)

    def _send(self, code: int, kind: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def package_server() -> Iterator[PackageServer]:
    server = PackageServer()
    thread = threading.Thread(target=server.serve_forever, name="package-index", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
