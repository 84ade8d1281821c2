"""A real S3-compatible server on loopback: moto in server mode, as a subprocess of its own.

``MotoS3Server`` starts ``python -m moto.server`` on a free loopback port, waits until it
answers, and offers a boto3 client with the fake credentials it accepts (``ENV``: what a skills
worker needs in its environment to reach it). ``stop()`` ends only the process it started.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

#: Credentials moto accepts (any); given to the skills worker through the AWS environment chain.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing-key-id",
    "AWS_SECRET_ACCESS_KEY": "testing-secret-never-shown",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MotoS3Server:
    def __init__(self, log_dir: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / "moto.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> MotoS3Server:
        with self.log_path.open("wb") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto exited: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=2):  # noqa: S310
                    return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        raise RuntimeError(f"moto did not answer in {timeout}s: {self.log_path.read_text()}")

    def client(self) -> Any:
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.url,
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            config=Config(s3={"addressing_style": "path"}),
        )

    def env(self, buckets: str) -> dict[str, str]:
        """The environment of a process that reads skills from this server."""
        return {
            **CREDENTIALS,
            "LOOPWRIGHT_SKILL_S3_BUCKETS": buckets,
            "LOOPWRIGHT_SKILL_S3_ENDPOINT_URL": self.url,
        }

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
