"""Run one program in the sandbox: choose the backend, spawn, feed, watch, cap, kill, sweep.

The core is asynchronous (the agent runtime is); ``run_sandboxed`` drives it with its own event
loop for synchronous callers such as Celery tasks.

Order of events in a run, and why:

1. A uid slot is taken (root only); if its last holder did not finish cleanly, it is swept
   and that holder's run directory deleted first.
2. The run directory is written and handed to the slot uid.
3. The chain from command.py is spawned in a new session (its own process group).
4. stdout and stderr are read incrementally; past ``output_cap_bytes`` the rest is discarded
   and the run is killed, so a program printing forever costs neither memory nor time.
5. At the wall-clock deadline the run is killed. In the bubblewrap backend killing bwrap's
   init (PID 1 of the sandbox) makes the kernel kill every process in the PID namespace; the
   outer bwrap then reaps it and exits.
6. After the exit, a sweep kills and waits for anything still alive in the run's scope (the
   rlimit-only backend relies on it: there, a program's children outlive it otherwise).
7. ``out/`` is collected without following links, then the run directory is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass

from sandbox.command import Launch, bwrap_launch, egress_enabled, rlimit_launch
from sandbox.config import SandboxConfig
from sandbox.egress import FORWARDER_NAME, forwarder_source
from sandbox.kills import RunKiller
from sandbox.launchfds import LaunchFds, launch_fds, sandbox_init
from sandbox.probe import BackendProbe, probe_backend
from sandbox.procs import RunScope, reap_stale_slots, sweep, uid_slot
from sandbox.types import (
    Backend,
    KilledReason,
    OutputFile,
    SandboxRequest,
    SandboxResult,
    SandboxUnavailable,
)
from sandbox.watchdog import WATCHDOG
from sandbox.workdir import (
    OutputCaps,
    RunDir,
    outputs_collect,
    rundir_create,
    rundir_remove,
    rundirs_remove_stale,
)

_READ_CHUNK = 64 * 1024
#: After a kill, how long the spawned process gets to exit before it is killed directly.
_EXIT_GRACE_SECONDS = 1.0
#: After the exit, how long stdout/stderr may take to reach end-of-file.
_DRAIN_GRACE_SECONDS = 2.0
#: The interpreter's own out-of-memory messages (CPython's MemoryError; V8's fatal OOM, a
#: failed ArrayBuffer allocation and Node's C++ allocation failure under RLIMIT_AS), looked for
#: at the end of stderr.
_MEMORY_MARKERS = (
    b"MemoryError",
    b"heap out of memory",
    b"Fatal process out of memory",
    b"Fatal process OOM",
    b"Array buffer allocation failed",
    b"std::bad_alloc",
)
#: CPython and Node both ignore SIGXFSZ, so RLIMIT_FSIZE shows up as an uncaught EFBIG.
_FILE_SIZE_MARKERS = (b"[Errno 27] File too large", b"EFBIG: file too large")


class OutputMeter:
    """A live view of one run for another thread (a progress watcher): when the program was
    spawned, on which backend, and how many bytes of stdout and stderr it wrote so far.

    The runner's event loop is the only writer; readers see plain attribute values (each read
    is atomic), good enough for progress reports.
    """

    def __init__(self) -> None:
        #: ``time.monotonic()`` when the program was spawned; None before.
        self.started_at: float | None = None
        self.backend: Backend | None = None
        self.stdout_bytes = 0
        self.stderr_bytes = 0

    def elapsed(self) -> float:
        return 0.0 if self.started_at is None else time.monotonic() - self.started_at


def run_sandboxed(
    request: SandboxRequest,
    config: SandboxConfig | None = None,
    meter: OutputMeter | None = None,
) -> SandboxResult:
    """Run ``request`` in the sandbox and wait for the result (synchronous callers).

    ``meter`` (optional) is updated while the program runs, for progress reports.

    Raises SandboxUnavailable when bubblewrap cannot run and the rlimit-only mode is not
    allowed, SandboxBusy when no uid slot frees up before the request's timeout. A failing,
    killed or misbehaving program is a normal result, never an exception.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_sandboxed_async(request, config, meter))
    raise RuntimeError(
        "run_sandboxed() called from a running event loop: await run_sandboxed_async"
    )


async def run_sandboxed_async(
    request: SandboxRequest,
    config: SandboxConfig | None = None,
    meter: OutputMeter | None = None,
) -> SandboxResult:
    """The asynchronous form of ``run_sandboxed`` (asyncio subprocesses, same guarantees).

    Processes are spawned from the calling event loop's thread; bubblewrap's
    ``--die-with-parent`` is tied to that thread, so the loop must outlive the run.
    """
    config = config or SandboxConfig.from_env()
    probe = await _probe(config)
    backend, notes = _select_backend(request, config, probe)
    _require_interpreter(config, request)
    if request.network == "restricted" and request.egress_socket is None:
        notes.append("network 'restricted' without an egress proxy socket: denied")
    elif request.network == "restricted" and backend == "rlimit-only":
        notes.append("network 'restricted' is not enforced by the rlimit-only backend")
    deadline = time.monotonic() + request.timeout_seconds
    async with uid_slot(config, deadline) as slot:
        uid = slot.uid if slot is not None else None
        work_root = config.resolved_work_root()
        # File work off the event loop: other runs' deadlines are timers on the same loop.
        if slot is not None and slot.was_dirty:
            await asyncio.to_thread(rundirs_remove_stale, work_root, slot.uid)
        rundir = await asyncio.to_thread(
            rundir_create,
            work_root=work_root,
            request=request,
            owner=(uid, uid) if uid is not None else None,
            uid=None if slot is None else slot.uid,
            # A borrowed work dir is bound as root in a private mount namespace (see workdir.py).
            bind_privately=uid is not None and backend == "bubblewrap" and probe.private_bind,
            sandbox_uids=config.sandbox_uids(),
        )
        try:
            outcome = await _run_in(rundir, request, config, backend, probe, uid, meter)
            files, file_notes = _collect(rundir, request)
        finally:
            await asyncio.to_thread(rundir_remove, rundir)
        if slot is not None:
            slot.clean = outcome.leftover_processes == 0
    return _result(outcome, backend, files, notes + file_notes)


def sandbox_reap_stale(config: SandboxConfig | None = None) -> int:
    """Clean up after workers that were killed mid-run; returns the slots cleaned.

    Call it when a skills worker starts. Only the dedicated-uid mode (a root runner) leaves
    state that can be found again; a non-root runner's sandboxes die with it and leave at most
    a ``loopwright-sbx-*`` directory in the work root.
    """
    config = config or SandboxConfig.from_env()
    reaped = reap_stale_slots(config)
    for slot in reaped:
        rundirs_remove_stale(config.resolved_work_root(), slot.uid)
    return len(reaped)


async def _probe(config: SandboxConfig) -> BackendProbe:
    # The first probe spawns bwrap (~50 ms): keep it off the event loop.
    return await asyncio.to_thread(probe_backend, config)


def _select_backend(
    request: SandboxRequest, config: SandboxConfig, probe: BackendProbe
) -> tuple[Backend, list[str]]:
    if probe.bubblewrap:
        notes = [] if probe.seccomp_error is None else [f"no seccomp filter: {probe.seccomp_error}"]
        return "bubblewrap", notes
    if request.allow_rlimit_only or config.allow_rlimit_only:
        return "rlimit-only", [
            f"bubblewrap unavailable ({probe.detail}): rlimit-only mode, the program can read "
            "what its uid can read on the host and use the host network"
        ]
    raise SandboxUnavailable(
        f"bubblewrap cannot run here: {probe.detail}. Run scripts/install-system-deps.sh, or "
        "accept the weaker rlimit-only mode with LOOPWRIGHT_SANDBOX_ALLOW_RLIMIT_ONLY=1 "
        "(see docs/sandbox.md)."
    )


def _require_interpreter(config: SandboxConfig, request: SandboxRequest) -> None:
    path = config.interpreter(request.language)
    if not os.access(path, os.X_OK):
        raise SandboxUnavailable(f"{request.language} interpreter {path} is not installed")


async def _run_in(
    rundir: RunDir,
    request: SandboxRequest,
    config: SandboxConfig,
    backend: Backend,
    probe: BackendProbe,
    uid: int | None,
    meter: OutputMeter | None = None,
) -> _Outcome:
    meter = meter or OutputMeter()
    meter.backend = backend
    if backend == "rlimit-only":
        launch = rlimit_launch(config=config, request=request, rundir=rundir, uid=uid)
        return await _execute(launch, request, uid=uid, fds=None, meter=meter)
    if egress_enabled(request):
        await asyncio.to_thread(_write_forwarder, rundir)
    with launch_fds(probe.seccomp_error is None) as fds:
        launch = bwrap_launch(
            config=config,
            request=request,
            rundir=rundir,
            uid=uid,
            seccomp_fd=fds.seccomp,
            args_fd=fds.args,
            status_fd=fds.status_write,
        )
        fds.fill_args(launch)
        return await _execute(launch, request, uid=uid, fds=fds, meter=meter)


def _write_forwarder(rundir: RunDir) -> None:
    path = rundir.root / FORWARDER_NAME
    path.write_text(forwarder_source())
    path.chmod(0o444)


# --- one execution ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Outcome:
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    exit_code: int
    timed_out: bool
    runner_reason: KilledReason | None
    duration_ms: int
    leftover_processes: int


async def _execute(
    launch: Launch,
    request: SandboxRequest,
    *,
    uid: int | None,
    fds: LaunchFds | None,
    meter: OutputMeter,
) -> _Outcome:
    """Spawn and supervise one launch; ``fds`` is None for the rlimit-only backend."""
    stdin = None if request.stdin is None else request.stdin.encode()
    proc = await asyncio.create_subprocess_exec(
        *launch.argv,
        stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=launch.env,
        cwd=launch.cwd,
        start_new_session=True,
        pass_fds=() if fds is None else fds.passed(),
    )
    started = time.monotonic()
    meter.started_at = started
    kills = RunKiller(RunScope(root_pid=proc.pid, pgid=proc.pid, uid=uid), include_root=fds is None)
    init = None
    if fds is not None:
        fds.after_spawn()
        init = asyncio.create_task(sandbox_init(fds.status_read, proc.pid))
        init.add_done_callback(kills.adopt_init)
    watch_id = WATCHDOG.watch(
        kills.scope, request.limits.memory_bytes, lambda: kills.kill("memory")
    )
    readers = [
        asyncio.create_task(_read_capped(stream, request.output_cap_bytes, kills, meter, name))
        for stream, name in ((proc.stdout, "stdout_bytes"), (proc.stderr, "stderr_bytes"))
        if stream is not None
    ]
    feeder = asyncio.create_task(_feed(proc, stdin))
    try:
        timed_out = await _wait_or_kill(proc, kills, request.timeout_seconds)
        duration_ms = int((time.monotonic() - started) * 1000)
        leftovers = await sweep(kills.scope)
        (out, out_cut), (err, err_cut) = await _drain(proc, readers)
    except asyncio.CancelledError:
        # The caller gave up (a cancelled agent run, its tool timeout): the program must not
        # outlive the request, nor keep a borrowed work dir after it is handed back.
        kills.kill_all()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), _EXIT_GRACE_SECONDS)
        await sweep(kills.scope)
        for reader in readers:
            reader.cancel()
        raise
    finally:
        WATCHDOG.unwatch(watch_id)
        for task in (feeder, init):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (feeder, init) if t is not None), return_exceptions=True)
        kills.release()
    return _Outcome(
        stdout=out,
        stderr=err,
        stdout_truncated=out_cut,
        stderr_truncated=err_cut,
        exit_code=_shell_status(proc.returncode),
        timed_out=timed_out,
        runner_reason=kills.reason,
        duration_ms=duration_ms,
        leftover_processes=leftovers,
    )


async def _wait_or_kill(proc: asyncio.subprocess.Process, kills: RunKiller, timeout: float) -> bool:
    """Wait for the exit; at the deadline kill the run. Returns whether the deadline hit."""
    try:
        await asyncio.wait_for(proc.wait(), timeout)
        return False
    except TimeoutError:
        kills.kill("timeout")
    try:
        await asyncio.wait_for(proc.wait(), _EXIT_GRACE_SECONDS)
    except TimeoutError:
        # Still running a second after the kill (killed before bwrap had forked its init?):
        # kill whatever the walk finds, and the outer process too (--die-with-parent takes
        # down anything left inside).
        kills.kill_walk()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
    return True


async def _read_capped(
    stream: asyncio.StreamReader, cap: int, kills: RunKiller, meter: OutputMeter, counter: str
) -> tuple[bytes, bool]:
    """Read to end-of-file keeping at most ``cap`` bytes; kill the run when it passes.
    ``meter.<counter>`` counts every byte read (kept or not)."""
    kept = bytearray()
    truncated = False
    while chunk := await stream.read(_READ_CHUNK):
        setattr(meter, counter, getattr(meter, counter) + len(chunk))
        if truncated:
            continue  # drain until the kill closes the pipe
        room = cap - len(kept)
        kept += chunk[:room]
        if len(chunk) > room:
            truncated = True
            kills.kill("output_cap")
    return bytes(kept), truncated


async def _feed(proc: asyncio.subprocess.Process, data: bytes | None) -> None:
    """Write stdin and close it; a program that exits without reading it is not an error."""
    if data is None or proc.stdin is None:
        return
    try:
        proc.stdin.write(data)
        await proc.stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        proc.stdin.close()


async def _drain(
    proc: asyncio.subprocess.Process, readers: list[asyncio.Task[tuple[bytes, bool]]]
) -> tuple[tuple[bytes, bool], tuple[bytes, bool]]:
    done, pending = await asyncio.wait(readers, timeout=_DRAIN_GRACE_SECONDS)
    if pending:
        # Something outside the run's scope still holds the pipes (only possible in the
        # rlimit-only backend as non-root). Stop reading and close our ends.
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        transport = getattr(proc, "_transport", None)  # no public way to close the pipes
        if transport is not None:
            transport.close()
    results = [t.result() if t in done else (b"", True) for t in readers]
    return results[0], results[1]


def _shell_status(returncode: int | None) -> int:
    if returncode is None:
        return -1
    return 128 - returncode if returncode < 0 else returncode


# --- result ----------------------------------------------------------------------------------


def _collect(rundir: RunDir, request: SandboxRequest) -> tuple[list[OutputFile], list[str]]:
    if request.collect_outputs is None:
        return [], []
    caps = OutputCaps(
        pattern=request.collect_outputs,
        file_bytes=request.output_file_cap_bytes,
        total_bytes=request.output_total_cap_bytes,
        max_files=request.output_max_files,
    )
    return outputs_collect(rundir.out, caps)


def killed_reason(
    runner_reason: KilledReason | None, exit_code: int, stderr: bytes
) -> KilledReason | None:
    """The runner's own kill first, then the kernel's limit signals, then the interpreter's
    own limit messages at the end of stderr. Labels only: a program can fake the last two,
    never the first."""
    if runner_reason is not None:
        return runner_reason
    if exit_code == 128 + signal.SIGXCPU:
        return "cpu"
    if exit_code == 128 + signal.SIGXFSZ:
        return "file_size"
    if exit_code == 0:
        return None
    tail = stderr[-8192:]
    if any(marker in tail for marker in _MEMORY_MARKERS):
        return "memory"
    if any(marker in tail for marker in _FILE_SIZE_MARKERS):
        return "file_size"
    return None


def _result(
    outcome: _Outcome, backend: Backend, files: list[OutputFile], notes: list[str]
) -> SandboxResult:
    if outcome.leftover_processes:
        notes.append(f"{outcome.leftover_processes} sandbox processes survived the final sweep")
    return SandboxResult(
        stdout=outcome.stdout.decode("utf-8", errors="replace"),
        stderr=outcome.stderr.decode("utf-8", errors="replace"),
        exit_code=outcome.exit_code,
        timed_out=outcome.timed_out,
        killed_reason=killed_reason(outcome.runner_reason, outcome.exit_code, outcome.stderr),
        stdout_truncated=outcome.stdout_truncated,
        stderr_truncated=outcome.stderr_truncated,
        duration_ms=outcome.duration_ms,
        output_files=tuple(files),
        backend=backend,
        notes=tuple(notes),
        leftover_processes=outcome.leftover_processes,
    )
