"""The Deno runtime of the sandbox: TypeScript with stdin, files and ``out/`` under bubblewrap,
Deno's permissions still refusing host files in the rlimit-only backend (where they are the
only file wall), the command line it is started with, and requests refused before a spawn."""

from __future__ import annotations

import dataclasses

import pytest

from sandbox import (
    MiB,
    SandboxConfig,
    SandboxLimits,
    SandboxRequest,
    SandboxRequestError,
    SandboxUnavailable,
    run_sandboxed,
)
from sandbox.denoargs import deno_argv, deno_env
from sandbox.types import DENO_RESERVED_ADDRESS_SPACE

TS_PROGRAM = """\
type Input = { words: string[] };
const input: Input = JSON.parse(await new Response(Deno.stdin.readable).text());
const data: string = Deno.readTextFileSync("data/in.txt");
Deno.mkdirSync("out", { recursive: true });
Deno.writeTextFileSync("out/n.txt", String(input.words.length));
await Deno.writeTextFile(await Deno.makeTempFile(), "scratch");  // the private /tmp
console.log(input.words.map((w: string) => w.toUpperCase()).join(" "), data.trim());
try { Deno.readTextFileSync("/etc/hostname"); } catch (e) { console.log((e as Error).name); }
"""


def test_a_typescript_program_runs_with_stdin_files_and_outputs() -> None:
    request = SandboxRequest(
        language="deno",
        code=TS_PROGRAM,
        stdin='{"words": ["a", "bc"]}',
        files={"data/in.txt": b"from a file\n"},
        collect_outputs="*",
    )
    result = run_sandboxed(request)
    assert result.backend == "bubblewrap"
    assert result.stdout == "A BC from a file\nNotCapable\n", result.stderr
    assert [(f.name, f.data) for f in result.output_files] == [("n.txt", b"2")]
    assert result.exit_code == 0 and result.leftover_processes == 0


def test_in_the_rlimit_only_backend_deno_still_refuses_host_files() -> None:
    config = dataclasses.replace(
        SandboxConfig.from_env(), bwrap_path="/nonexistent/bwrap", allow_rlimit_only=True
    )
    code = (
        "for (const p of ['/etc/hostname', '/etc/passwd']) {\n"
        "  try { Deno.readTextFileSync(p); console.log('READ', p); }\n"
        "  catch (e) { console.log('DENIED', p, (e as Error).name); }\n"
        "}\n"
        "Deno.writeTextFileSync('out/ok.txt', 'ok');\n"
    )
    result = run_sandboxed(SandboxRequest(language="deno", code=code, collect_outputs="*"), config)
    assert result.backend == "rlimit-only"
    assert result.stdout.splitlines() == [
        "DENIED /etc/hostname NotCapable",
        "DENIED /etc/passwd NotCapable",
    ], result.stderr
    assert [f.name for f in result.output_files] == ["ok.txt"]


def test_deno_is_started_with_its_permissions_and_a_heap_from_the_address_space() -> None:
    argv = deno_argv(
        "/opt/deno",
        "/code/main.ts",
        readable=("/workdir", "/tmp"),
        writable=("/workdir", "/tmp"),
        net=[],
        address_space=DENO_RESERVED_ADDRESS_SPACE + 300 * MiB,
    )
    assert argv == [
        "/opt/deno", "run", "--no-prompt", "--no-config", "--no-lock", "--no-remote",
        "--no-npm", "--cached-only", "--no-check",
        "--allow-read=/code/main.ts,/workdir,/tmp", "--allow-write=/workdir,/tmp",
        "--allow-env", "--v8-flags=--max-old-space-size=300", "/code/main.ts",
    ]  # fmt: skip
    assert not any(a.startswith(("--allow-run", "--allow-all", "-A")) for a in argv)
    assert deno_env("/tmp")["DENO_DIR"] == "/tmp/.deno"


@pytest.mark.parametrize("name", ["DENO_DIR", "DENO_V8_FLAGS", "DENO_AUDIT_PERMISSIONS"])
def test_deno_variables_are_the_runners_own(name: str) -> None:
    with pytest.raises(SandboxRequestError, match="controlled by the sandbox"):
        SandboxRequest(language="deno", code="", env={name: "x"})


def test_an_address_space_below_denos_reservation_is_refused() -> None:
    limits = SandboxLimits(address_space_bytes=1024 * MiB)
    with pytest.raises(SandboxRequestError, match="deno needs an address space of at least"):
        SandboxRequest(language="deno", code="", limits=limits)


def test_a_missing_deno_binary_is_reported_before_a_spawn() -> None:
    config = dataclasses.replace(SandboxConfig.from_env(), deno_path="/nonexistent/deno")
    with pytest.raises(SandboxUnavailable, match="deno interpreter /nonexistent/deno"):
        run_sandboxed(SandboxRequest(language="deno", code="console.log(1)"), config)
