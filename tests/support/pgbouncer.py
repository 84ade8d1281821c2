"""A real PgBouncer on loopback, in transaction pooling, in front of the test PostgreSQL.

``python -m tests.support.pgbouncer [--port N] [--upstream 127.0.0.1:5432]`` starts one in the
foreground, prints ``PGBOUNCER_PORT=<port>`` once it accepts connections, and stops it on
SIGTERM/SIGINT (``scripts/pgbouncer-suite.sh`` runs part of the suite through it). Any database
name is passed through to the same name upstream (``* =``), so Django's test databases work;
trust authentication for the users listed (``postgres``). Run as root, it drops to the
``postgres`` user (PgBouncer refuses to run as root).

:func:`release_database` asks PgBouncer's admin console to close its connections to a
database (``KILL``), so the database can be dropped: Django drops its test database at the end
of the run, and PgBouncer would otherwise keep idle server connections to it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

#: Set by the suite script: the admin console (``postgres://postgres@127.0.0.1:<port>/pgbouncer``).
ADMIN_URL_ENV = "LOOPWRIGHT_TEST_PGBOUNCER_ADMIN_URL"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def config(port: int, upstream_host: str, upstream_port: int, folder: Path, user: str) -> str:
    run_as = f"user = {user}\n" if os.geteuid() == 0 else ""
    return (
        "[databases]\n"
        f"* = host={upstream_host} port={upstream_port}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {folder / 'users.txt'}\n"
        f"admin_users = {user}\n"
        "pool_mode = transaction\n"
        # Short transactions wait for a server connection; the cap keeps us well under
        # PostgreSQL's max_connections, shared with whatever else runs on the host.
        "default_pool_size = 20\n"
        "max_db_connections = 25\n"
        "max_client_conn = 1000\n"
        "server_check_delay = 1\n"
        "ignore_startup_parameters = extra_float_digits\n"
        f"logfile = {folder / 'pgbouncer.log'}\n"
        f"pidfile = {folder / 'pgbouncer.pid'}\n"
        f"{run_as}"
    )


class PgBouncer:
    """``with PgBouncer() as bouncer:`` one PgBouncer process; ``bouncer.port`` while it runs."""

    def __init__(
        self, upstream_host: str = "127.0.0.1", upstream_port: int = 5432, port: int = 0
    ) -> None:
        self.upstream_host, self.upstream_port = upstream_host, upstream_port
        self.port = port or free_port()
        self.user = "postgres"
        self.folder = Path(tempfile.mkdtemp(prefix="lw-pgbouncer-"))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> PgBouncer:
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        (self.folder / "users.txt").write_text(f'"{self.user}" ""\n')
        ini = self.folder / "pgbouncer.ini"
        ini.write_text(
            config(self.port, self.upstream_host, self.upstream_port, self.folder, self.user)
        )
        if os.geteuid() == 0:  # it drops to ``user`` and then writes its log and pid file
            shutil.chown(self.folder, user=self.user)
            for path in self.folder.iterdir():
                shutil.chown(path, user=self.user)
        self.process = subprocess.Popen([binary, str(ini)], stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited {self.process.returncode}: {self.log()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer did not listen on {self.port}: {self.log()}")

    def url(self, dbname: str) -> str:
        return f"postgres://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def log(self) -> str:
        path = self.folder / "pgbouncer.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def release_database(dbname: str) -> None:
    """Close PgBouncer's connections to ``dbname`` (when the suite runs through one: the
    admin console's URL in :data:`ADMIN_URL_ENV`), so it can be dropped; nothing otherwise."""
    admin_url = os.environ.get(ADMIN_URL_ENV)
    if not admin_url:
        return
    import psycopg

    # The admin console speaks the simple query protocol only: a client-side binding cursor.
    with psycopg.connect(admin_url, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        conn.execute(f'KILL "{dbname}"')
        conn.execute(f'RESUME "{dbname}"')


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--upstream", default="127.0.0.1:5432")
    args = parser.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    bouncer = PgBouncer(host, int(port), args.port).start()

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)  # out of the wait below (stopping in here would wait inside a wait)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        print(f"PGBOUNCER_PORT={bouncer.port}", flush=True)
        assert bouncer.process is not None
        code = bouncer.process.wait()
        print(f"pgbouncer exited {code}: {bouncer.log()}", file=sys.stderr)
        sys.exit(1)
    finally:
        bouncer.stop()


if __name__ == "__main__":
    main()


def end_other_sessions(url: str, dbname: str, wait_seconds: float = 10.0) -> list[str]:
    """Before the test database is dropped: wait for the other sessions on ``dbname`` to end
    (a process a test stopped may take a moment to be seen gone), then end those still there.
    Returns what each ended one was (application, client, start, state, query), for the log."""
    import time

    import psycopg

    others = (
        "SELECT pid, application_name, client_addr, client_port, backend_start, state, "
        "left(query, 160) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
    )
    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + wait_seconds
        rows = conn.execute(others, [dbname]).fetchall()
        while rows and time.monotonic() < deadline:
            time.sleep(0.2)
            rows = conn.execute(others, [dbname]).fetchall()
        for row in rows:
            conn.execute("SELECT pg_terminate_backend(%s)", [row[0]])
    return [" | ".join(str(v) for v in row) for row in rows]
