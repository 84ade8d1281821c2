"""Guarded Git checkouts (Skill Hub imports, knowledge bases synced from Git).

The repository (an ``https://`` URL; the schemes and hosts are settings) is cloned with the
``git`` command into a temporary directory at ``ref``, through the outbound guard
(docs/security.md): the host's addresses are checked and pinned (``http.curloptResolve``), no
redirects, no other protocol, no credential helper, no user or system git configuration,
symlinks checked out as plain files, at most ``GIT_MAX_BYTES`` on disk and
``GIT_TIMEOUT_SECONDS`` in all.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from orchestrator import guard
from orchestrator.errors import InvalidInput
from runtime import outbound

GIT_TIMEOUT_SECONDS = 120
#: Largest checkout (repository and working tree) a Git import may write.
GIT_MAX_BYTES = 256 * 1024 * 1024
#: A transfer slower than this many bytes/s for ``GIT_LOW_SPEED_SECONDS`` is aborted.
GIT_LOW_SPEED_BYTES, GIT_LOW_SPEED_SECONDS = 1000, 30
#: What a repository URL may look like: no userinfo, query or fragment; ASCII only, so that
#: git's URL parser (curl's) sees the host the guard checked and pinned.
_GIT_URL = re.compile(r"^(?P<scheme>[a-z]+)://(?P<authority>[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\])"
                      r"(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~!$&'()*+,;=:%/-]*)?$")  # fmt: skip


class GitImportError(InvalidInput):
    problem_type = "git-import-error"
    title = "Git import failed"


def _refused(detail: str) -> GitImportError:
    return GitImportError(
        detail, errors=[{"pointer": "/repository", "detail": detail, "code": "refused"}]
    )


@dataclass(frozen=True)
class _Remote:
    """A repository URL that passed the guard: git's options pin it to the checked addresses."""

    scheme: str
    options: tuple[str, ...]


def _check_repository(repository: str) -> _Remote:
    """The guard's verdict on ``repository``: allowed scheme (``LOOPWRIGHT_GIT_SCHEMES``) and
    host (``LOOPWRIGHT_GIT_HOSTS``), a canonical URL, and addresses the outbound policy allows."""
    policy = guard.git_policy()
    schemes = " or ".join(f"{s}://" for s in sorted(policy.schemes))
    match = _GIT_URL.match(repository)
    if match is None or match["scheme"] not in policy.schemes:
        raise _refused(
            f"the repository must be a plain {schemes} URL (LOOPWRIGHT_GIT_SCHEMES; no local "
            f"paths, file://, ssh, git:// or ext:: transports, no user@, query or fragment): "
            f"{repository[:200]!r} is not"
        )
    try:
        target = outbound.check_url(repository, policy)
        if target.host != match["authority"].lower().strip("[]") and target.literal is None:
            raise _refused(f"write the host in canonical form ({target.host})")
        hosts = settings.LOOPWRIGHT_OUTBOUND["GIT_HOSTS"]
        if hosts and not outbound.host_listed(target.host, hosts):
            raise _refused(f"{target.host} is not one of the hosts LOOPWRIGHT_GIT_HOSTS allows")
        addresses = outbound.resolve_checked(target.host, target.port, policy)
    except outbound.OutboundRefused as exc:
        raise _refused(f"repository refused: {exc}") from None
    except OSError as exc:
        raise GitImportError(f"cannot resolve {match['authority']}: {exc}") from None
    pinned = ",".join(f"[{a}]" if ":" in a else a for a in addresses)
    options = (
        "-c", f"protocol.{target.scheme}.allow=always",
        "-c", f"http.curloptResolve={target.host}:{target.port}:{pinned}",
    )  # fmt: skip
    return _Remote(target.scheme, options if target.literal is None else options[:2])


#: Every git command: no protocol but the one allowed per clone, no redirects, no credential
#: helpers or prompts, symlinks as plain files (a link to /etc/... stays a text file).
_GIT_OPTIONS = (
    "-c", "protocol.allow=never", "-c", "http.followRedirects=false", "-c", "credential.helper=",
    "-c", "core.symlinks=false", "-c", "core.hooksPath=/dev/null", "-c", "init.templateDir=",
    "-c", "submodule.recurse=false", "-c", f"http.lowSpeedLimit={GIT_LOW_SPEED_BYTES}",
    "-c", f"http.lowSpeedTime={GIT_LOW_SPEED_SECONDS}",
)  # fmt: skip


def _git_env(home: str, scheme: str) -> dict[str, str]:
    """A minimal environment: none of the server's variables (or proxies), no user config."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "XDG_CONFIG_HOME": home,
        "LANG": "C", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "/bin/false", "SSH_ASKPASS": "/bin/false",
        "GIT_ALLOW_PROTOCOL": scheme,
    }  # fmt: skip


def _tree_size(root: str) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def _git(*args: str, cwd: str | None = None, env: dict[str, str], watch: str) -> str:
    """Run git; kill it past ``GIT_TIMEOUT_SECONDS`` or when ``watch`` outgrows the cap."""
    command = ["git", *_GIT_OPTIONS, *args]
    name = next(a for a in args if not a.startswith("-") and "=" not in a)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=err)
        except OSError as exc:
            raise GitImportError(f"git {name} failed: {exc}") from exc
        problem = _wait(process, watch)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if problem:
        raise GitImportError(f"git {name} stopped: {problem}")
    if process.returncode != 0:
        raise GitImportError(f"git {name} failed: {stderr.strip()[-500:]}")
    return stdout.strip()


def _wait(process: subprocess.Popen[bytes], watch: str) -> str:
    deadline = time.monotonic() + GIT_TIMEOUT_SECONDS
    while True:
        try:
            process.wait(timeout=0.2)
            return ""
        except subprocess.TimeoutExpired:
            pass
        problem = ""
        if time.monotonic() > deadline:
            problem = f"it took longer than {GIT_TIMEOUT_SECONDS} s"
        elif _tree_size(watch) > GIT_MAX_BYTES:
            problem = f"the repository is larger than {GIT_MAX_BYTES // 2**20} MiB"
        if problem:
            process.kill()
            process.wait()
            return problem


@contextmanager
def git_checkout(repository: str, ref: str) -> Iterator[tuple[Path, str]]:
    """A checkout of ``repository`` at ``ref`` in a temporary directory (removed on exit):
    its root and the commit checked out."""
    remote = _check_repository(repository)
    if ref.startswith("-"):
        raise GitImportError(f"not a ref: {ref!r}")
    with tempfile.TemporaryDirectory(prefix="loopwright-git-") as tmp:
        target = str(Path(tmp) / "repo")
        env = _git_env(tmp, remote.scheme)
        clone = ("clone", "--quiet", "--no-checkout", "--", repository, target)
        _git(*remote.options, *clone, env=env, watch=tmp)
        _git("checkout", "--quiet", "--detach", ref, "--", cwd=target, env=env, watch=tmp)
        commit = _git("rev-parse", "HEAD", cwd=target, env=env, watch=tmp)
        yield Path(target), commit
