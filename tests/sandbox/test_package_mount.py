"""A package environment in the real sandbox: bound read-only, its ``site-packages`` appended
to ``sys.path`` while Python keeps ``-I -S`` (no PYTHON* variables, no site, no script dir);
Node.js finds ``/node_modules`` from the program's own directory."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import SandboxRequest, run_sandboxed

PROBE = """\
import json, sys, envmod
try:
    open("/skill-env/site-packages/new.py", "w")
    wrote = True
except OSError as exc:
    wrote = exc.errno
print(json.dumps({
    "value": envmod.VALUE, "isolated": sys.flags.isolated, "no_site": sys.flags.no_site,
    "last": sys.path[-1], "argv": sys.argv, "name": __name__, "wrote": wrote,
    "site_loaded": "site" in sys.modules,
}))
"""


@pytest.fixture
def env_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="lw-env-mount-", dir="/tmp"))
    root.chmod(0o755)
    (root / "site-packages").mkdir(mode=0o755)
    (root / "site-packages" / "envmod.py").write_text("VALUE = 'from the env'\n")
    (root / "node_modules" / "envmod").mkdir(parents=True, mode=0o755)
    (root / "node_modules" / "envmod" / "index.js").write_text("module.exports = 'node env';\n")
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_python_imports_from_the_read_only_env_and_stays_isolated(env_root: Path) -> None:
    request = SandboxRequest(language="python", code=PROBE, packages_dir=str(env_root))
    result = run_sandboxed(request)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {
        "value": "from the env", "isolated": 1, "no_site": 1,
        "last": "/skill-env/site-packages", "argv": ["/code/main.py"], "name": "__main__",
        "wrote": 30, "site_loaded": False,
    }  # fmt: skip
    assert not (env_root / "site-packages" / "new.py").exists()


def test_without_an_env_nothing_is_bound(env_root: Path) -> None:
    result = run_sandboxed(SandboxRequest(language="python", code="import envmod\n"))
    assert result.exit_code == 1 and "No module named 'envmod'" in result.stderr


def test_node_requires_from_the_read_only_node_modules(env_root: Path) -> None:
    code = (
        "console.log(require('envmod'));\n"
        "try { require('fs').writeFileSync('/node_modules/x', 'y'); console.log('wrote'); }\n"
        "catch (err) { console.log(err.code); }\n"
    )
    result = run_sandboxed(SandboxRequest(language="node", code=code, packages_dir=str(env_root)))
    assert (result.exit_code, result.stdout) == (0, "node env\nEROFS\n"), result.stderr
