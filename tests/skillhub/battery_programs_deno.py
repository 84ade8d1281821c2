"""The hostile programs of the S1 battery in Deno (TypeScript), one per case, doing what the
Python and Node.js ones do with Deno's own APIs (``Deno.readTextFileSync``, ``Deno.connect``,
``fetch``, ``Deno.Command``...). Each prints the lines the case's check reads; a refusal prints
the error's name, so a check can tell Deno's permission wall (``NotCapable``) from bubblewrap's
(``NotFound``, ``PermissionDenied``, a refused connection). ``{canary}`` and the like are filled
in by ``battery_cases.build_case``."""

from __future__ import annotations

DENO_CODE: dict[int, str] = {
    1: """
for (const p of [{canary}, "/etc/shadow", "/root/.bashrc", {repo} + "/pyproject.toml",
                 "/var/lib/postgresql", "/proc/1/root" + {canary}, "/home"]) {{
  try {{ console.log("READ", p, Deno.readTextFileSync(p).slice(0, 100)); }}
  catch (e) {{ console.log("DENIED", p, (e as Error).name); }}
}}
try {{ console.log(Deno.readTextFileSync("/etc/passwd")); }}
catch (e) {{ console.log("DENIED /etc/passwd", (e as Error).name); }}
console.log("DONE");
""",
    2: """
for (const p of [{drop} + "/x", {canary_dir} + "/x", "/usr/x", "/etc/x", "/x", "/dev/x",
                 "/code/main.ts", "/proc/x", {repo} + "/x"]) {{
  try {{ Deno.writeTextFileSync(p, "x"); console.log("WROTE", p); }}
  catch (e) {{ console.log("DENIED", p, (e as Error).name); }}
}}
Deno.writeTextFileSync("/tmp/lw-escape-" + {tail}, "x");
console.log("WROTE-TMP");
""",
    3: """
const timeout = (ms: number) =>
  new Promise<never>((_, reject) => setTimeout(() => reject(new Error("timeout")), ms));
for (const port of [6379, 5432, {port}]) {{
  try {{
    const conn = await Promise.race([Deno.connect({{ hostname: "127.0.0.1", port }}),
                                     timeout(1000)]);
    console.log("CONNECTED", port);
    conn.close();
  }} catch (e) {{ console.log("REFUSED", port, (e as Error).name); }}
}}
try {{
  await Promise.race([fetch("http://127.0.0.1:" + {port} + "/"), timeout(1000)]);
  console.log("CONNECTED fetch");
}} catch (e) {{ console.log("FETCH-REFUSED", (e as Error).name); }}
Deno.exit(0);
""",
    4: """
console.log("ENV", JSON.stringify(Deno.env.toObject()));
try {{ console.log(Deno.readTextFileSync("/proc/self/environ")); }}
catch (e) {{ console.log("DENIED /proc/self/environ", (e as Error).name); }}
let pids: string[] = [];
try {{
  pids = [...Deno.readDirSync("/proc")].map((d) => d.name).filter((p) => /^\\d+$/.test(p));
}} catch (e) {{ console.log("DENIED /proc", (e as Error).name); }}
for (const pid of pids) {{
  try {{ console.log(pid, Deno.readTextFileSync(`/proc/${{pid}}/environ`)); }}
  catch (e) {{ console.log(pid, (e as Error).name); }}
}}
""",
    5: """
let pids: string[] = [];
try {{
  pids = [...Deno.readDirSync("/proc")].map((d) => d.name).filter((p) => /^\\d+$/.test(p));
}} catch (e) {{ console.log("DENIED /proc", (e as Error).name); }}
console.log("PIDS", pids.length);
for (const pid of pids) {{
  try {{ console.log(pid, Deno.readTextFileSync(`/proc/${{pid}}/cmdline`)); }}
  catch (e) {{ console.log(pid, (e as Error).name); }}
}}
for (const p of ["/", "/tmp", "/run", "/var/tmp", "/proc/1/root/tmp"]) {{
  try {{ console.log(p, [...Deno.readDirSync(p)].map((d) => d.name)); }}
  catch (e) {{ console.log(p, (e as Error).name); }}
}}
""",
    6: """
const started = Date.now();
let peak = 0;
let failures = 0;
let first = "";
let reported = false;
function report() {{
  if (!reported) {{
    reported = true;
    console.log("PROCS", peak, "FAILURES", failures, "FIRST", first);
  }}
}}
setInterval(() => {{
  for (let i = 0; i < 20; i++) {{
    try {{
      // nice 19: the spinners share the sandbox's CPU with Deno itself, which must report.
      new Deno.Command("/usr/bin/nice", {{
        args: ["-n", "19", "/bin/sh", "-c", "while :; do :; done"],
        stdin: "null", stdout: "null", stderr: "null",
      }}).spawn();
    }} catch (e) {{ failures++; first ||= (e as Error).name; }}
  }}
  try {{
    const procs = [...Deno.readDirSync("/proc")].filter((d) => /^\\d+$/.test(d.name)).length;
    peak = Math.max(peak, procs);
  }} catch (e) {{ /* Deno's wall: /proc is not readable */ }}
  if (failures > 0 && Date.now() - started > 300) report();
}}, 20);
setTimeout(report, 1000);
""",
    7: """
const hoard: Uint8Array[] = [];
for (;;) hoard.push(new Uint8Array(50 * 1024 * 1024).fill(1));
""",
    8: """
for (;;) {{}}
""",
    9: """
setInterval(() => {{}}, 1e9);
""",
    10: """
let rest = new TextEncoder().encode("x".repeat(50 * 1024 * 1024));
while (rest.length > 0) rest = rest.subarray(Deno.stdout.writeSync(rest));
""",
    11: """
const quiet = {{ stdin: "null", stdout: "null", stderr: "null" }} as const;
for (const [cmd, args] of [
  [Deno.execPath(), ["eval", "setInterval(() => {{}}, 1e9)", {marker}]],
  ["/bin/sh", ["-c", "nohup /usr/bin/python3 -c 'import time; time.sleep(1000)' "
               + {marker} + " &"]],
] as [string, string[]][]) {{
  try {{ new Deno.Command(cmd, {{ args, detached: true, ...quiet }}).spawn().unref(); }}
  catch (e) {{ console.log("SPAWN-DENIED", (e as Error).name); }}
}}
setTimeout(() => {{
  let daemons = 0;
  try {{
    for (const d of Deno.readDirSync("/proc")) {{
      if (!/^\\d+$/.test(d.name)) continue;
      try {{ daemons += Deno.readTextFileSync(`/proc/${{d.name}}/cmdline`).includes({marker}) ? 1 : 0; }}
      catch (e) {{ /* gone */ }}
    }}
  }} catch (e) {{ console.log("DENIED /proc", (e as Error).name); }}
  console.log("DAEMONS", daemons);
}}, 500);
setInterval(() => {{}}, 1e9);
""",
    12: """
function attempt(name: string, cmd: string, args: string[]) {{
  try {{
    const r = new Deno.Command(cmd, {{ args, stdout: "null", stderr: "piped" }}).outputSync();
    const last = new TextDecoder().decode(r.stderr).trim().split("\\n").pop();
    console.log("CALL", name, r.code, last, r.code === 0 ? "OK" : "FAILED");
  }} catch (e) {{ console.log("CALL", name, -1, (e as Error).name, "FAILED"); }}
}}
attempt("mount-tmpfs", "/usr/bin/mount", ["-t", "tmpfs", "none", "/workdir"]);
attempt("unshare-user", "/usr/bin/unshare", ["-r", "true"]);
attempt("nsenter-host", "/usr/bin/nsenter", ["-t", "1", "-m", "true"]);
attempt("ptrace-attach-deno", "/usr/bin/python3", ["-c",
  "import ctypes,sys; l=ctypes.CDLL(None); sys.exit(0 if l.ptrace(16, "
  + Deno.pid + ", 0, 0) == 0 else 1)"]);
""",
    13: """
try {{
  const r = new Deno.Command("/bin/sh", {{
    args: ["-c", "id; touch " + {drop} + "/command || true"],
  }}).outputSync();
  console.log(new TextDecoder().decode(r.stdout));
}} catch (e) {{ console.log("COMMAND-DENIED", (e as Error).name); }}
try {{
  const cp = await import("node:child_process");
  cp.execSync("touch " + {drop} + "/node-child-process");
  console.log("NODE-CP-RAN");
}} catch (e) {{ console.log("NODE-CP-DENIED", (e as Error).name); }}
try {{ Deno.writeTextFileSync({drop} + "/direct", "x"); console.log("OPENED"); }}
catch (e) {{ console.log("DENIED", (e as Error).name); }}
""",
    14: """
for (const [name, target] of [["link", {canary}], ["out/leak.txt", {canary}],
                              ["out/leakdir", {canary_dir}], ["out/etc-passwd", "/etc/passwd"]]) {{
  try {{ Deno.symlinkSync(target, name); console.log("SYMLINKED", name); }}
  catch (e) {{ console.log("NO-SYMLINK", name, (e as Error).name); }}
}}
try {{ console.log(Deno.readTextFileSync("link")); }}
catch (e) {{ console.log("DENIED", (e as Error).name); }}
try {{ Deno.linkSync(Deno.execPath(), "out/hard"); console.log("LINKED"); }}
catch (e) {{ console.log("NO-HARDLINK", (e as Error).name); }}
Deno.writeTextFileSync("out/real.txt", "ok");
""",
}
