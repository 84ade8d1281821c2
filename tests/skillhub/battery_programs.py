"""The hostile programs of the S1 battery, one per case, in Python and in Node.js; ``{canary}``
and the like are filled in by ``battery_cases.build_case``."""

from __future__ import annotations

PY_CODE: dict[int, str] = {
    1: """
import os
for path in [{canary}, "/etc/shadow", "/root/.bashrc", {repo} + "/pyproject.toml",
             "/var/lib/postgresql", "/proc/1/root" + {canary}, "/home"]:
    try:
        with open(path) as handle:
            print("READ", path, handle.read()[:100])
    except OSError as exc:
        print("DENIED", path, type(exc).__name__)
print(open("/etc/passwd").read())
print("DONE")
""",
    2: """
for path in [{drop} + "/x", {canary_dir} + "/x", "/usr/x", "/etc/x", "/x", "/dev/x",
             "/code/main.py", "/proc/x", {repo} + "/x"]:
    try:
        with open(path, "w") as handle:
            handle.write("x")
        print("WROTE", path)
    except OSError as exc:
        print("DENIED", path, type(exc).__name__)
with open("/tmp/lw-escape-" + {tail}, "w") as handle:
    handle.write("x")
print("WROTE-TMP")
""",
    3: """
import socket
for port in (6379, 5432, {port}):
    sock = socket.socket()
    sock.settimeout(1)
    try:
        sock.connect(("127.0.0.1", port))
        print("CONNECTED", port)
    except OSError as exc:
        print("REFUSED", port, exc)
""",
    4: """
import os
print("ENV", dict(os.environ))
print(open("/proc/self/environ", "rb").read())
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            print(pid, open(f"/proc/{{pid}}/environ", "rb").read())
        except OSError as exc:
            print(pid, exc)
""",
    5: """
import os
pids = [p for p in os.listdir("/proc") if p.isdigit()]
print("PIDS", len(pids))
for pid in pids:
    try:
        print(pid, open(f"/proc/{{pid}}/cmdline", "rb").read())
    except OSError as exc:
        print(pid, exc)
print(os.listdir("/"), os.listdir("/tmp"))
for path in ["/run", "/var/tmp", "/proc/1/root/tmp"]:
    try:
        print(path, os.listdir(path))
    except OSError as exc:
        print(path, exc)
""",
    6: """
import os, time
start, failures = time.time(), 0
while time.time() - start < 1.0:
    try:
        if os.fork() == 0:
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
    except OSError:
        failures += 1
procs = len([p for p in os.listdir("/proc") if p.isdigit()])
print("PROCS", procs, "FAILURES", failures, flush=True)
time.sleep(100)
""",
    7: """
hoard = []
while True:
    hoard.append(b"x" * (50 * 1024 * 1024))
""",
    8: """
while True:
    pass
""",
    9: """
import time
time.sleep(10_000)
""",
    10: """
import sys
sys.stdout.buffer.write(b"x" * (50 * 1024 * 1024))
sys.stdout.flush()
""",
    11: """
import os, subprocess, time
sleeper = ["/usr/bin/python3", "-c", "import time; time.sleep(1000)", {marker}]
def detach():
    try:
        os.setsid()
    except OSError as exc:
        print("setsid refused:", exc, flush=True)
subprocess.Popen(sleeper, preexec_fn=detach, stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if os.fork() == 0:
    detach()
    if os.fork() == 0:
        os.execv(sleeper[0], sleeper)
    os._exit(0)
time.sleep(0.5)
daemons = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        daemons += {marker}.encode() in open(f"/proc/{{pid}}/cmdline", "rb").read()
    except OSError:
        pass
print("DAEMONS", daemons, flush=True)
time.sleep(1000)
""",
    12: """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
def attempt(name, rc):
    err = ctypes.get_errno()
    print("CALL", name, rc, os.strerror(err), "FAILED" if rc == -1 else "OK")
attempt("ptrace-attach-child", libc.ptrace(16, child, 0, 0))
attempt("ptrace-attach-init", libc.ptrace(16, 1, 0, 0))
attempt("mount-tmpfs", libc.mount(b"none", b"/workdir", b"tmpfs", 0, None))
attempt("umount-usr", libc.umount2(b"/usr", 2))
attempt("unshare-user", libc.unshare(0x10000000))
attempt("unshare-mount", libc.unshare(0x00020000))
os.kill(child, 9)
""",
    13: """
import ctypes, os, subprocess
os.system("id; touch " + {drop} + "/os-system")
ctypes.CDLL(None).system(("touch " + {drop} + "/ctypes-system").encode())
subprocess.run(["/bin/sh", "-c", "echo x > " + {drop} + "/subprocess"])
try:
    fd = os.open({drop} + "/direct", os.O_WRONLY | os.O_CREAT, 0o644)
    print("OPENED")
except OSError as exc:
    print("DENIED", exc)
""",
    14: """
import os
for name, target in [("link", {canary}), ("out/leak.txt", {canary}),
                     ("out/leakdir", {canary_dir}), ("out/etc-passwd", "/etc/passwd")]:
    os.symlink(target, name)
try:
    print(open("link").read())
except OSError as exc:
    print("DENIED", exc)
try:
    os.link("/usr/bin/python3", "out/hard")
    print("LINKED")
except OSError as exc:
    print("NO-HARDLINK", exc)
with open("out/real.txt", "w") as handle:
    handle.write("ok")
""",
}

NODE_CODE: dict[int, str] = {
    1: """
const fs = require("fs");
for (const p of [{canary}, "/etc/shadow", "/root/.bashrc", {repo} + "/pyproject.toml",
                 "/var/lib/postgresql", "/proc/1/root" + {canary}, "/home"]) {{
  try {{ console.log("READ", p, fs.readFileSync(p, "utf8").slice(0, 100)); }}
  catch (e) {{ console.log("DENIED", p, e.code); }}
}}
console.log(fs.readFileSync("/etc/passwd", "utf8"));
console.log("DONE");
""",
    2: """
const fs = require("fs");
for (const p of [{drop} + "/x", {canary_dir} + "/x", "/usr/x", "/etc/x", "/x", "/dev/x",
                 "/code/main.js", "/proc/x", {repo} + "/x"]) {{
  try {{ fs.writeFileSync(p, "x"); console.log("WROTE", p); }}
  catch (e) {{ console.log("DENIED", p, e.code); }}
}}
fs.writeFileSync("/tmp/lw-escape-" + {tail}, "x");
console.log("WROTE-TMP");
""",
    3: """
const net = require("net");
let pending = 3;
for (const port of [6379, 5432, {port}]) {{
  const sock = net.connect({{ host: "127.0.0.1", port }});
  sock.setTimeout(1000, () => {{ console.log("REFUSED", port, "timeout"); sock.destroy(); }});
  sock.on("connect", () => {{ console.log("CONNECTED", port); sock.destroy(); }});
  sock.on("error", (e) => console.log("REFUSED", port, e.code));
}}
""",
    4: """
const fs = require("fs");
console.log("ENV", JSON.stringify(process.env));
console.log(fs.readFileSync("/proc/self/environ", "utf8"));
for (const pid of fs.readdirSync("/proc").filter((p) => /^\\d+$/.test(p))) {{
  try {{ console.log(pid, fs.readFileSync(`/proc/${{pid}}/environ`, "utf8")); }}
  catch (e) {{ console.log(pid, e.code); }}
}}
""",
    5: """
const fs = require("fs");
const pids = fs.readdirSync("/proc").filter((p) => /^\\d+$/.test(p));
console.log("PIDS", pids.length);
for (const pid of pids) {{
  try {{ console.log(pid, fs.readFileSync(`/proc/${{pid}}/cmdline`, "utf8")); }}
  catch (e) {{ console.log(pid, e.code); }}
}}
console.log(fs.readdirSync("/"), fs.readdirSync("/tmp"));
for (const p of ["/run", "/var/tmp", "/proc/1/root/tmp"]) {{
  try {{ console.log(p, fs.readdirSync(p)); }} catch (e) {{ console.log(p, e.code); }}
}}
""",
    6: """
const cp = require("child_process");
const fs = require("fs");
const started = Date.now();
let peak = 0;
let failures = 0;
let reported = false;
function report() {{
  if (!reported) {{ reported = true; console.log("PROCS", peak, "FAILURES", failures); }}
}}
setInterval(() => {{
  for (let i = 0; i < 20; i++) {{
    try {{
      // nice 19: the spinners share the sandbox's CPU with node itself, which must report.
      cp.spawn("/usr/bin/nice", ["-n", "19", "/bin/sh", "-c", "while :; do :; done"],
               {{ stdio: "ignore" }}).on("error", () => failures++);
    }} catch (e) {{ failures++; }}
  }}
  peak = Math.max(peak, fs.readdirSync("/proc").filter((p) => /^\\d+$/.test(p)).length);
  // Report once the limit has bitten for a while: a starved timer could miss the deadline.
  if (failures > 0 && Date.now() - started > 300) report();
}}, 20);
setTimeout(report, 1000);
""",
    7: """
const hoard = [];
for (;;) hoard.push(Buffer.alloc(50 * 1024 * 1024, 1));
""",
    8: """
for (;;) {{}}
""",
    9: """
setInterval(() => {{}}, 1e9);
""",
    10: """
process.stdout.write("x".repeat(50 * 1024 * 1024));
""",
    11: """
const cp = require("child_process");
cp.spawn(process.execPath, ["-e", "setInterval(() => {{}}, 1e9)", {marker}],
         {{ detached: true, stdio: "ignore" }}).unref();
cp.spawn("/bin/sh", ["-c", "nohup /usr/bin/python3 -c 'import time; time.sleep(1000)' "
         + {marker} + " &"], {{ detached: true, stdio: "ignore" }}).unref();
setTimeout(() => {{
  const fs = require("fs");
  const daemons = fs.readdirSync("/proc").filter((p) => /^\\d+$/.test(p)).filter((p) => {{
    try {{ return fs.readFileSync(`/proc/${{p}}/cmdline`, "utf8").includes({marker}); }}
    catch (e) {{ return false; }}
  }}).length;
  console.log("DAEMONS", daemons);
}}, 500);
setInterval(() => {{}}, 1e9);
""",
    12: """
const cp = require("child_process");
function attempt(name, cmd, args) {{
  const r = cp.spawnSync(cmd, args, {{ encoding: "utf8" }});
  console.log("CALL", name, r.status, (r.stderr || "").trim().split("\\n").pop(),
              r.status === 0 ? "OK" : "FAILED");
}}
attempt("mount-tmpfs", "/usr/bin/mount", ["-t", "tmpfs", "none", "/workdir"]);
attempt("unshare-user", "/usr/bin/unshare", ["-r", "true"]);
attempt("nsenter-host", "/usr/bin/nsenter", ["-t", "1", "-m", "true"]);
attempt("ptrace-attach-node", "/usr/bin/python3", ["-c",
  "import ctypes,sys; l=ctypes.CDLL(None); sys.exit(0 if l.ptrace(16, "
  + process.pid + ", 0, 0) == 0 else 1)"]);
""",
    13: """
const cp = require("child_process");
console.log(cp.execSync("id; touch " + {drop} + "/exec-sync || true", {{ encoding: "utf8" }}));
if (process.getBuiltinModule) {{
  process.getBuiltinModule("child_process")
    .spawnSync("/bin/sh", ["-c", "touch " + {drop} + "/builtin-module"]);
}}
try {{
  process.binding("fs").writeFileUtf8({drop} + "/binding-fs", "x", 65, 0o644);
  console.log("BINDING-WROTE");
}} catch (e) {{ console.log("BINDING-DENIED", e.code || e.message); }}
""",
    14: """
const fs = require("fs");
for (const [name, target] of [["link", {canary}], ["out/leak.txt", {canary}],
                              ["out/leakdir", {canary_dir}], ["out/etc-passwd", "/etc/passwd"]]) {{
  fs.symlinkSync(target, name);
}}
try {{ console.log(fs.readFileSync("link", "utf8")); }} catch (e) {{ console.log("DENIED", e.code); }}
try {{ fs.linkSync("/usr/bin/node", "out/hard"); console.log("LINKED"); }}
catch (e) {{ console.log("NO-HARDLINK", e.code); }}
fs.writeFileSync("out/real.txt", "ok");
""",
}
