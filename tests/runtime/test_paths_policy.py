"""The harness's ``paths`` section in the file tools and in ``bash`` (real bubblewrap sandboxes).

The compiled settings come from the calling invocation (``ToolContext.invocation.harness``),
hand-built here; tests/e2e/test_paths_deny_run.py goes through the engine."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.tools import FileToolConfig, ToolContext, ToolError, ToolResult, builtin_registry
from runtime.tools.base import Invocation
from runtime.tools.bash import BashConfig, BashTool, bash_tool, sandbox_unavailable_reason
from runtime.tools.workspace import PathRules, denied_below

LAYER = "profile:secretive@1"


def invocation(paths: dict[str, Any] | None, *, provenance: bool = True) -> Invocation:
    settings: dict[str, Any] = {"isolation": {"networkAccess": "deny"}}
    if paths is not None:
        settings["paths"] = paths
    return Invocation(
        run_id=uuid.uuid4(),
        role="maker",
        name="maker:0",
        employee="mia",
        harness=settings,
        harness_provenance={f"paths.{k}": LAYER for k in (paths or {})} if provenance else None,
    )


@pytest.fixture
def workdir() -> Iterator[Path]:
    parent = Path(tempfile.mkdtemp(prefix="lw-paths-test-"))
    root = parent / "work"
    root.mkdir()
    (root / "secrets").mkdir()
    (root / "secrets" / "key.txt").write_text("s3cret\n")
    (root / "secrets" / "nested").mkdir()
    (root / "secrets" / "nested" / "deep.txt").write_text("d33p\n")
    (root / "config").mkdir()
    (root / "config" / "prod.token").write_text("tok\n")
    (root / "config" / "app.ini").write_text("[app]\n")
    (root / "README.md").write_text("hello\n")
    yield root
    shutil.rmtree(parent)


def ctx(workdir: Path, inv: Invocation | None, key: str = "run:1:0", **kw: Any) -> ToolContext:
    return ToolContext(
        workdir=str(workdir),
        idempotency_key=key,
        deadline=time.monotonic() + 60,
        invocation=inv,
        **kw,
    )


def call(name: str, arguments: dict[str, Any], context: ToolContext, **config: Any) -> Any:
    tool = builtin_registry(FileToolConfig(**config)).get(name)
    assert tool is not None
    return asyncio.run(tool.run(arguments, context))


DENY = {"deny": ["secrets/**", "*.token"]}


# --- the rules ---------------------------------------------------------------------------------


def test_rules_read_the_compiled_settings_and_their_provenance() -> None:
    rules = PathRules.of(invocation({"deny": ["secrets/**"], "maxFiles": 3}))
    assert rules.deny == ("secrets/**",) and rules.max_files == 3
    assert rules.denied("secrets/key.txt") == f"refused by paths.deny 'secrets/**' (set by {LAYER})"
    assert rules.denied("secrets") is not None  # everything below it is denied
    assert rules.denied("src/secrets.py") is None
    assert rules.max_files_reason() == f"paths.maxFiles = 3 (set by {LAYER})"
    assert PathRules.of(None) == PathRules()
    assert denied_below("a/b", ("a/*",)) == "a/*" and denied_below("a", ("a/*.txt",)) is None


# --- file tools --------------------------------------------------------------------------------


def test_read_of_a_denied_path_is_refused_naming_the_setting_and_layer(workdir: Path) -> None:
    with pytest.raises(ToolError) as refused:
        call("read", {"path": "secrets/key.txt"}, ctx(workdir, invocation(DENY)))
    message = str(refused.value)
    assert "paths.deny 'secrets/**'" in message and LAYER in message
    assert "s3cret" not in message
    with pytest.raises(ToolError, match=r"paths.deny '\*.token'"):
        call("read", {"path": "config/prod.token"}, ctx(workdir, invocation(DENY)))
    # Through a lexical detour too.
    with pytest.raises(ToolError, match=r"paths\.deny"):
        call("read", {"path": "config/../secrets/./key.txt"}, ctx(workdir, invocation(DENY)))
    # The same read without the harness setting works (only the registry defaults apply).
    assert call("read", {"path": "secrets/key.txt"}, ctx(workdir, invocation(None))).content == (
        "s3cret\n"
    )


def test_a_symlink_to_a_denied_file_is_refused(workdir: Path) -> None:
    (workdir / "alias.txt").symlink_to(workdir / "secrets" / "key.txt")
    with pytest.raises(ToolError, match=r"paths\.deny"):
        call("read", {"path": "alias.txt"}, ctx(workdir, invocation(DENY)))


def test_write_and_edit_of_denied_paths_are_refused(workdir: Path) -> None:
    context = ctx(workdir, invocation(DENY))
    with pytest.raises(ToolError, match=r"paths\.deny 'secrets/"):
        call("write", {"path": "secrets/new.txt", "content": "x"}, context)
    with pytest.raises(ToolError, match=r"paths.deny '\*.token'"):
        call("edit", {"path": "config/prod.token", "old_text": "tok", "new_text": "x"}, context)
    assert not (workdir / "secrets" / "new.txt").exists()
    assert (workdir / "config" / "prod.token").read_text() == "tok\n"
    assert context.files_written == set()


def test_list_leaves_denied_entries_out(workdir: Path) -> None:
    context = ctx(workdir, invocation(DENY))
    listed = call("list", {"path": ".", "recursive": True}, context).content.splitlines()
    assert "README.md" in listed and "config/app.ini" in listed
    assert not [e for e in listed if "secrets" in e or e.endswith(".token")]
    with pytest.raises(ToolError, match=r"paths\.deny"):
        call("list", {"path": "secrets"}, context)


def test_max_files_of_the_harness_bounds_distinct_writes(workdir: Path) -> None:
    context = ctx(workdir, invocation({"maxFiles": 2}))
    call("write", {"path": "a.txt", "content": "a"}, context)
    call("write", {"path": "b.txt", "content": "b"}, ctx(workdir, context.invocation, key="k2",
         files_written=context.files_written))  # fmt: skip
    # Writing one of the two again is fine; a third file is refused, naming the layer.
    call("edit", {"path": "a.txt", "old_text": "a", "new_text": "A"},
         ctx(workdir, context.invocation, key="k3", files_written=context.files_written))  # fmt: skip
    with pytest.raises(ToolError) as refused:
        call("write", {"path": "c.txt", "content": "c"},
             ctx(workdir, context.invocation, key="k4", files_written=context.files_written))  # fmt: skip
    assert f"paths.maxFiles = 2 (set by {LAYER})" in str(refused.value)
    assert not (workdir / "c.txt").exists()


def test_the_lower_of_the_tool_limit_and_the_harness_limit_binds(workdir: Path) -> None:
    context = ctx(workdir, invocation({"maxFiles": 5}))
    call("write", {"path": "a.txt", "content": "a"}, context, max_files=1)
    with pytest.raises(ToolError) as refused:
        call("write", {"path": "b.txt", "content": "b"},
             ctx(workdir, context.invocation, key="k2", files_written=context.files_written),
             max_files=1)  # fmt: skip
    assert "at most 1 distinct" in str(refused.value) and "paths.maxFiles" not in str(refused.value)
    context = ctx(workdir, invocation({"maxFiles": 0}))
    with pytest.raises(ToolError, match=r"paths.maxFiles = 0"):
        call("write", {"path": "z.txt", "content": "z"}, context, max_files=4)


# --- bash --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tool() -> BashTool:
    made = bash_tool(BashConfig())
    assert made is not None, f"the sandbox must run here: {sandbox_unavailable_reason()}"
    return made


def bash(tool: BashTool, command: str, context: ToolContext) -> ToolResult:
    return asyncio.run(tool.run({"command": command}, context))


def test_bash_cannot_read_or_change_denied_paths(tool: BashTool, workdir: Path) -> None:
    result = bash(
        tool,
        "cat secrets/key.txt; ls -A secrets; cat secrets/nested/deep.txt; "
        "echo '--token:'; cat config/prod.token; echo '--'; "
        "echo pwned > secrets/key.txt; echo planted > secrets/planted.txt; "
        "echo pwned > config/prod.token; rm -f config/prod.token; cat README.md",
        ctx(workdir, invocation(DENY)),
    )
    assert "s3cret" not in result.content and "d33p" not in result.content
    assert "tok" not in result.content.split("--token:")[1].split("--")[0]
    assert "hello" in result.content  # the rest of the tree is there
    assert (workdir / "secrets" / "key.txt").read_text() == "s3cret\n"
    assert (workdir / "config" / "prod.token").read_text() == "tok\n"
    assert not (workdir / "secrets" / "planted.txt").exists()
    assert sorted(p.name for p in (workdir / "secrets").iterdir()) == ["key.txt", "nested"]


def test_bash_cannot_read_through_a_denied_link_name(tool: BashTool, workdir: Path) -> None:
    (workdir / "vault").mkdir()
    (workdir / "vault" / "pin.txt").write_text("p1n-code\n")
    (workdir / "private").symlink_to("vault")
    (workdir / "one.token").symlink_to("README.md")
    result = bash(
        tool,
        "cat private/pin.txt; cat vault/pin.txt; cat one.token; echo done",
        ctx(workdir, invocation({"deny": ["private/**", "private", "*.token"]})),
    )
    assert "p1n-code" not in result.content and "hello" not in result.content
    assert "done" in result.content


def test_bash_removes_what_it_created_under_a_deny_glob_and_says_so(
    tool: BashTool, workdir: Path
) -> None:
    result = bash(
        tool,
        "echo t > new.token; mkdir -p secrets2 && echo x > ok.txt; echo fine > notes.md",
        ctx(workdir, invocation({"deny": ["*.token", "secrets2/**"]})),
    )
    assert result.is_error
    assert f"paths.deny (set by {LAYER})" in result.content
    assert "new.token" in result.content and "secrets2" in result.content
    assert not (workdir / "new.token").exists() and not (workdir / "secrets2").exists()
    assert (workdir / "notes.md").read_text() == "fine\n" and (workdir / "ok.txt").exists()
    assert set(result.files_written) == {"notes.md", "ok.txt"}


def test_bash_over_max_files_keeps_changes_to_existing_files_and_removes_extra_new_ones(
    tool: BashTool, workdir: Path
) -> None:
    context = ctx(workdir, invocation({"maxFiles": 3}), files_written={"earlier.txt"})
    result = bash(
        tool, "echo more >> README.md; for f in a b c d; do echo $f > $f.txt; done", context
    )
    assert result.is_error
    assert f"refused by paths.maxFiles = 3 (set by {LAYER})" in result.content
    assert "c.txt, d.txt" in result.content
    assert (workdir / "README.md").read_text() == "hello\nmore\n"
    assert (workdir / "a.txt").exists() and not (workdir / "c.txt").exists()
    assert context.files_written == {"earlier.txt", "README.md", "a.txt"}
    # Within the limit: no refusal, and files already counted cost nothing.
    again = bash(tool, "echo again > a.txt; echo again >> README.md", context)
    assert not again.is_error and "paths.maxFiles" not in again.content


def test_bash_without_paths_settings_scans_nothing_and_reads_everything(
    tool: BashTool, workdir: Path
) -> None:
    result = bash(tool, "cat secrets/key.txt; echo x > y.token", ctx(workdir, invocation(None)))
    assert "s3cret" in result.content and (workdir / "y.token").exists()
    assert result.files_written == ()


def test_bash_refuses_a_tree_too_large_to_keep_the_settings(
    tool: BashTool, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.tools import bash_paths

    monkeypatch.setattr(bash_paths, "MAX_SCAN_ENTRIES", 3)
    with pytest.raises(ToolError) as refused:
        bash(tool, "echo ran > ran.txt", ctx(workdir, invocation({"maxFiles": 4})))
    assert f"paths.maxFiles = 4 (set by {LAYER})" in str(refused.value)
    assert not (workdir / "ran.txt").exists()


def test_bash_changes_inside_git_do_not_count_against_max_files(
    tool: BashTool, workdir: Path
) -> None:
    (workdir / ".git").mkdir()
    context = ctx(workdir, invocation({"maxFiles": 1}))
    result = bash(tool, "echo o > .git/ORIG_HEAD; mkdir .git/objects; echo x > one.txt", context)
    assert not result.is_error and context.files_written == {"one.txt"}
