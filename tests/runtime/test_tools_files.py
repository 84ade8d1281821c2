"""Builtin file tools: behaviour, confinement to the working directory, deny list, maxFiles,
and write-once effects per idempotency key."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from runtime.tools import (
    DirectoryLedger,
    FileToolConfig,
    ToolContext,
    ToolError,
    ToolResult,
    builtin_registry,
)
from runtime.tools.workspace import Workspace
from runtime.types import Effect


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    root.mkdir()
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("print('hello')\n")
    (root / "README.md").write_text("# Project\n")
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "secret.txt").write_text("top secret")
    return secret


def context(workdir: Path | None, key: str = "run:1:0", **extra: Any) -> ToolContext:
    return ToolContext(
        workdir=str(workdir) if workdir else None,
        idempotency_key=key,
        deadline=time.monotonic() + 30,
        **extra,
    )


def run(
    name: str,
    arguments: dict[str, Any],
    workdir: Path | None,
    *,
    config: FileToolConfig | None = None,
    ctx: ToolContext | None = None,
) -> ToolResult:
    tool = builtin_registry(config).get(name)
    assert tool is not None
    return asyncio.run(tool.run(arguments, ctx or context(workdir)))


def refused(name: str, arguments: dict[str, Any], workdir: Path | None, **kw: Any) -> str:
    with pytest.raises(ToolError) as error:
        run(name, arguments, workdir, **kw)
    return str(error.value)


# --- behaviour -------------------------------------------------------------------------------


def test_the_builtin_registry_declares_effects_and_schemas() -> None:
    registry = builtin_registry()
    effects = {spec.name: spec.effect for spec in registry.specs()}
    assert effects == {
        "read": Effect.READ,
        "list": Effect.READ,
        "write": Effect.WRITE,
        "edit": Effect.WRITE,
    }
    assert "bash" not in registry
    for spec in registry.specs():
        assert spec.parameters["type"] == "object"
        assert spec.parameters["additionalProperties"] is False


def test_read_returns_the_file_text(workdir: Path) -> None:
    assert run("read", {"path": "src/app.py"}, workdir).content == "print('hello')\n"


def test_read_can_return_a_window_of_lines(workdir: Path) -> None:
    (workdir / "lines.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    result = run("read", {"path": "lines.txt", "offset": 3, "limit": 2}, workdir).content
    assert result == "[lines 3-4 of 10]\nline 3\nline 4\n"


def test_read_refuses_binary_files_and_directories(workdir: Path) -> None:
    (workdir / "blob.bin").write_bytes(b"\x00\x01\x02")
    assert "binary" in refused("read", {"path": "blob.bin"}, workdir)
    assert "use the list tool" in refused("read", {"path": "src"}, workdir)


def test_read_of_a_missing_file_says_what_to_do(workdir: Path) -> None:
    assert "does not exist. Use the list tool" in refused("read", {"path": "nope.txt"}, workdir)


def test_write_creates_parents_and_replaces_content(workdir: Path) -> None:
    result = run("write", {"path": "docs/new/notes.md", "content": "héllo"}, workdir)
    assert (workdir / "docs/new/notes.md").read_text() == "héllo"
    assert result.files_written == ("docs/new/notes.md",)
    run(
        "write",
        {"path": "docs/new/notes.md", "content": "second"},
        workdir,
        ctx=context(workdir, key="run:2:0"),
    )
    assert (workdir / "docs/new/notes.md").read_text() == "second"
    assert not [p for p in (workdir / "docs/new").iterdir() if p.name.endswith(".tmp")]


def test_write_keeps_the_mode_of_an_existing_file(workdir: Path) -> None:
    script = workdir / "run.sh"
    script.write_text("echo old\n")
    script.chmod(0o755)
    run("write", {"path": "run.sh", "content": "echo new\n"}, workdir)
    assert script.stat().st_mode & 0o777 == 0o755


def test_edit_replaces_one_exact_occurrence(workdir: Path) -> None:
    result = run(
        "edit",
        {"path": "src/app.py", "old_text": "'hello'", "new_text": "'bye'"},
        workdir,
    )
    assert (workdir / "src/app.py").read_text() == "print('bye')\n"
    assert "Replaced 1 occurrence" in result.content


def test_edit_with_missing_old_text_says_so(workdir: Path) -> None:
    message = refused(
        "edit", {"path": "src/app.py", "old_text": "goodbye", "new_text": "x"}, workdir
    )
    assert "old_text was not found" in message
    assert "copy the exact text" in message


def test_edit_hints_at_whitespace_differences(workdir: Path) -> None:
    message = refused(
        "edit", {"path": "src/app.py", "old_text": "  print('hello')  ", "new_text": "x"}, workdir
    )
    assert "different surrounding whitespace" in message


def test_edit_with_ambiguous_old_text_asks_for_context_or_replace_all(workdir: Path) -> None:
    (workdir / "dup.txt").write_text("x = 1\nx = 1\n")
    message = refused("edit", {"path": "dup.txt", "old_text": "x = 1", "new_text": "y"}, workdir)
    assert "occurs 2 times" in message
    assert "replace_all" in message
    run(
        "edit",
        {"path": "dup.txt", "old_text": "x = 1", "new_text": "y", "replace_all": True},
        workdir,
    )
    assert (workdir / "dup.txt").read_text() == "y\ny\n"


def test_edit_matches_lf_text_in_a_crlf_file(workdir: Path) -> None:
    (workdir / "win.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    run("edit", {"path": "win.txt", "old_text": "one\ntwo", "new_text": "1\n2"}, workdir)
    assert (workdir / "win.txt").read_bytes() == b"1\r\n2\r\nthree\r\n"


def test_list_shows_directories_with_a_slash(workdir: Path) -> None:
    assert run("list", {}, workdir).content == "README.md\nsrc/"
    assert run("list", {"recursive": True}, workdir).content == "README.md\nsrc/\nsrc/app.py"
    assert run("list", {"path": "src"}, workdir).content == "app.py"


def test_list_stops_at_the_entry_limit(workdir: Path) -> None:
    for i in range(5):
        (workdir / f"f{i}.txt").write_text("")
    content = run("list", {}, workdir, config=FileToolConfig(max_list_entries=3)).content
    assert content.splitlines()[-1] == "[stopped after 3 entries; list a subdirectory]"


# --- confinement ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["../outside/secret.txt", "src/../../outside/secret.txt"])
def test_dot_dot_paths_that_leave_the_workdir_are_refused(
    workdir: Path, outside: Path, path: str
) -> None:
    assert "outside the working directory" in refused("read", {"path": path}, workdir)
    assert "outside the working directory" in refused(
        "write", {"path": path, "content": "x"}, workdir
    )
    assert (outside / "secret.txt").read_text() == "top secret"


def test_dot_dot_paths_that_stay_inside_are_fine(workdir: Path) -> None:
    assert run("read", {"path": "src/../README.md"}, workdir).content == "# Project\n"


def test_absolute_paths_outside_are_refused_and_inside_are_fine(
    workdir: Path, outside: Path
) -> None:
    assert "outside" in refused("read", {"path": str(outside / "secret.txt")}, workdir)
    assert "outside" in refused("read", {"path": "/etc/passwd"}, workdir)
    assert run("read", {"path": str(workdir / "README.md")}, workdir).content == "# Project\n"


def test_a_symlinked_file_pointing_outside_cannot_be_read_or_written(
    workdir: Path, outside: Path
) -> None:
    (workdir / "link.txt").symlink_to(outside / "secret.txt")
    assert "through a symlink" in refused("read", {"path": "link.txt"}, workdir)
    assert "through a symlink" in refused(
        "write", {"path": "link.txt", "content": "pwned"}, workdir
    )
    assert "through a symlink" in refused(
        "edit", {"path": "link.txt", "old_text": "top", "new_text": "x"}, workdir
    )
    assert (outside / "secret.txt").read_text() == "top secret"


def test_a_symlinked_directory_pointing_outside_cannot_be_used(
    workdir: Path, outside: Path
) -> None:
    (workdir / "escape").symlink_to(outside, target_is_directory=True)
    assert "through a symlink" in refused("read", {"path": "escape/secret.txt"}, workdir)
    assert "through a symlink" in refused(
        "write", {"path": "escape/new.txt", "content": "x"}, workdir
    )
    assert "through a symlink" in refused("list", {"path": "escape"}, workdir)
    assert not (outside / "new.txt").exists()


def test_a_dangling_symlink_pointing_outside_cannot_be_written_through(
    workdir: Path, outside: Path
) -> None:
    (workdir / "trap.txt").symlink_to(outside / "created-by-agent.txt")
    assert "through a symlink" in refused("write", {"path": "trap.txt", "content": "x"}, workdir)
    assert not (outside / "created-by-agent.txt").exists()


def test_symlinks_inside_the_workdir_are_followed(workdir: Path) -> None:
    (workdir / "alias.md").symlink_to(workdir / "README.md")
    assert run("read", {"path": "alias.md"}, workdir).content == "# Project\n"
    run("write", {"path": "alias.md", "content": "# New\n"}, workdir)
    assert (workdir / "README.md").read_text() == "# New\n"
    assert (workdir / "alias.md").is_symlink()


def test_list_does_not_follow_symlinks(workdir: Path, outside: Path) -> None:
    (workdir / "escape").symlink_to(outside, target_is_directory=True)
    listing = run("list", {"recursive": True}, workdir).content
    assert "escape (symlink)" in listing
    assert "secret.txt" not in listing


def test_file_tools_need_a_working_directory() -> None:
    assert "no working directory" in refused("read", {"path": "a"}, None)


# --- deny list and maxFiles ------------------------------------------------------------------


def test_default_deny_patterns_protect_git_env_and_keys(workdir: Path) -> None:
    (workdir / ".git").mkdir()
    (workdir / ".git" / "config").write_text("[core]")
    (workdir / ".env").write_text("TOKEN=x")
    for path in (".git/config", ".git/hooks/pre-commit", ".env", ".env.local", "certs/server.pem"):
        assert "protected" in refused("write", {"path": path, "content": "x"}, workdir), path
    assert "protected" in refused("read", {"path": ".env"}, workdir)
    assert not (workdir / ".git" / "hooks").exists()


def test_a_symlink_to_a_denied_file_is_denied_too(workdir: Path) -> None:
    (workdir / ".env").write_text("TOKEN=x")
    (workdir / "innocent.txt").symlink_to(workdir / ".env")
    assert "protected" in refused("read", {"path": "innocent.txt"}, workdir)


def test_list_hides_denied_entries(workdir: Path) -> None:
    (workdir / ".git").mkdir()
    (workdir / ".env").write_text("x")
    listing = run("list", {"recursive": True}, workdir).content
    assert ".git" not in listing
    assert ".env" not in listing


def test_deny_patterns_are_configurable_per_registry(workdir: Path) -> None:
    config = FileToolConfig(deny_patterns=("secrets/*", "*.lock"))
    assert "protected" in refused(
        "write", {"path": "secrets/db.txt", "content": "x"}, workdir, config=config
    )
    assert "protected" in refused(
        "write", {"path": "deep/poetry.lock", "content": "x"}, workdir, config=config
    )
    run("write", {"path": ".env", "content": "allowed here"}, workdir, config=config)


def test_max_files_limits_distinct_files_written_per_invocation(workdir: Path) -> None:
    config = FileToolConfig(max_files=2)
    shared = context(workdir)
    for index, path in enumerate(["a.txt", "b.txt", "a.txt"]):
        ctx = context(workdir, key=f"run:{index}:0", files_written=shared.files_written)
        run("write", {"path": path, "content": str(index)}, workdir, config=config, ctx=ctx)
    ctx = context(workdir, key="run:9:0", files_written=shared.files_written)
    with pytest.raises(ToolError, match="at most 2 distinct files"):
        run("write", {"path": "c.txt", "content": "x"}, workdir, config=config, ctx=ctx)
    assert not (workdir / "c.txt").exists()
    assert shared.files_written == {"a.txt", "b.txt"}


def test_a_failed_write_does_not_count_against_max_files(workdir: Path) -> None:
    (workdir / "blocker").write_text("a file, not a directory")
    ctx = context(workdir)
    with pytest.raises(ToolError):
        run("write", {"path": "blocker/x.txt", "content": "x"}, workdir, ctx=ctx)
    assert ctx.files_written == set()


# --- idempotency --------------------------------------------------------------------------------


def test_an_edit_reissued_with_the_same_key_after_a_crash_applies_once(
    workdir: Path, tmp_path: Path
) -> None:
    ledger_dir = tmp_path / "ledger"
    arguments = {"path": "src/app.py", "old_text": "'hello'", "new_text": "'hello' * 2"}
    first = run(
        "edit", arguments, workdir, config=FileToolConfig(ledger=DirectoryLedger(ledger_dir))
    )
    # A new process (new registry, same ledger directory) re-issues the call with its key.
    again = run(
        "edit", arguments, workdir, config=FileToolConfig(ledger=DirectoryLedger(ledger_dir))
    )
    assert (workdir / "src/app.py").read_text() == "print('hello' * 2)\n"
    assert again.content == f"{first.content} (already applied)"
    assert again.files_written == ("src/app.py",)


def test_a_ledger_entry_without_the_effect_lets_the_reissue_apply(
    workdir: Path, tmp_path: Path
) -> None:
    from runtime.tools.ledger import LedgerEntry, digest

    ledger = DirectoryLedger(tmp_path / "ledger")
    # The crash came after the ledger write but before the rename: the file is unchanged.
    ledger.put("run:1:0", LedgerEntry("src/app.py", digest(b"never written"), "Replaced"))
    arguments = {"path": "src/app.py", "old_text": "hello", "new_text": "bye"}
    run("edit", arguments, workdir, config=FileToolConfig(ledger=ledger))
    assert (workdir / "src/app.py").read_text() == "print('bye')\n"


def test_the_same_edit_under_a_new_key_is_a_new_call(workdir: Path) -> None:
    config = FileToolConfig()
    arguments = {"path": "src/app.py", "old_text": "print('hello')", "new_text": "pass"}
    run("edit", arguments, workdir, config=config, ctx=context(workdir, key="run:1:0"))
    message = refused(
        "edit", arguments, workdir, config=config, ctx=context(workdir, key="run:2:0")
    )
    assert "not found" in message


def test_a_cancelled_list_stops(workdir: Path) -> None:
    ctx = context(workdir)
    ctx.cancelled.set()
    assert "cancelled" in refused("list", {}, workdir, ctx=ctx)


def test_write_refuses_a_directory_as_target(workdir: Path) -> None:
    os.mkdir(workdir / "adir")
    assert "is a directory" in refused("write", {"path": "adir", "content": "x"}, workdir)


def test_a_descriptor_that_ended_up_outside_is_refused(workdir: Path, outside: Path) -> None:
    # What a symlink swapped in between the path check and the open would produce.
    workspace = Workspace(str(workdir), ())
    target = workspace.resolve("README.md")
    fd = os.open(outside / "secret.txt", os.O_RDONLY)
    try:
        with pytest.raises(ToolError, match="changed to point outside"):
            workspace.verify_descriptor(fd, target)
    finally:
        os.close(fd)


def test_a_workdir_reached_through_a_symlink_accepts_absolute_paths_through_it(
    workdir: Path, tmp_path: Path
) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(workdir, target_is_directory=True)
    result = run("read", {"path": str(alias / "README.md")}, alias)
    assert result.content == "# Project\n"
    assert run("read", {"path": "README.md"}, alias).content == "# Project\n"
    assert "outside" in refused("read", {"path": str(alias / ".." / "outside")}, alias)
