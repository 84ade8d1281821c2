#!/usr/bin/env bash
# Install the Debian packages Loopwright needs on the host. Idempotent: a package is installed
# only when missing, and apt-get runs (after `apt-get update`) only when something is.
#
#   bubblewrap    the skill sandbox (sandbox, docs/sandbox.md)
#   libseccomp2   compiles the sandbox's seccomp filter (loaded through ctypes)
#   util-linux    choom, setpriv, prlimit, unshare: the sandbox's exec chain
#   mount         binds a run's workspace for its bash sandbox (a private mount namespace)
#   coreutils     nice
#   python3       the interpreter Python skills run with (/usr/bin/python3)
#   nodejs        the interpreter Node.js skills run with (/usr/bin/node), only if no node exists
#   npm           fetches Deno (below), only when Deno is not installed at its pinned version
#   chromium      the browser of the UI tests (Playwright drives Debian's build; no downloads)
#   faketime      skewed worker clocks in the lease clock-skew test (D5), so it runs, not skips
#   pgbouncer     the suite through a transaction pooler (scripts/pgbouncer-suite.sh)
set -euo pipefail

packages=(bubblewrap libseccomp2 util-linux mount coreutils chromium faketime pgbouncer)
missing=()
distro=$( . /etc/os-release 2>/dev/null && echo "${ID:-}")
if [ "$distro" = ubuntu ]; then
  # Ubuntu has no chromium .deb (its package installs a snap, which Playwright cannot drive
  # headless as root): the UI browser tests need Debian's or a snap's binary on PATH.
  packages=(bubblewrap libseccomp2 util-linux mount coreutils faketime pgbouncer)
  command -v chromium >/dev/null 2>&1 ||
    echo "note: Ubuntu: install Chromium for the UI browser tests with 'sudo snap install chromium' (they fail without it)" >&2
fi

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

for pkg in "${packages[@]}"; do
  installed "$pkg" || missing+=("$pkg")
done
[ -x /usr/bin/python3 ] || missing+=(python3)
# Any Node.js already on the machine is kept (e.g. a newer one from another source); the
# sandbox expects it at /usr/bin/node unless LOOPWRIGHT_SANDBOX_NODE says otherwise.
command -v node >/dev/null 2>&1 || missing+=(nodejs)

# Deno, the runtime of `deno` skills. Debian 12 packages no Deno: the npm registry's build is
# used, pinned (exact version and integrity hashes) in deploy/deno/package-lock.json.
repo="$(cd "$(dirname "$0")/.." && pwd)"
deno_home="${LOOPWRIGHT_DENO_HOME:-/opt/loopwright/deno}"
deno_version=$(sed -n 's/^ *"deno": "\([0-9.]*\)"$/\1/p' "$repo/deploy/deno/package.json")
deno_current() {
  "$deno_home/bin/deno" --version 2>/dev/null | head -n 1 | cut -d' ' -f2
}
if [ "$(deno_current)" != "$deno_version" ]; then
  command -v npm >/dev/null 2>&1 || missing+=(npm)
fi

if [ "${#missing[@]}" -gt 0 ]; then
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
      echo "missing packages: ${missing[*]}; run this script as root (there is no sudo)" >&2
      exit 1
    fi
    sudo=(sudo)
  fi
  echo "==> installing: ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
else
  echo "==> system packages present: ${packages[*]} python3 node"
fi

if [ "$(deno_current)" != "$deno_version" ]; then
  echo "==> installing Deno $deno_version into $deno_home/bin/deno"
  staging=$(mktemp -d)
  trap 'rm -rf "$staging"' EXIT
  cp "$repo/deploy/deno/package.json" "$repo/deploy/deno/package-lock.json" "$staging/"
  # --ignore-scripts: the deno package's postinstall only relinks its bin; the binary itself
  # comes from the platform package npm selects (@deno/linux-x64-glibc, -arm64-glibc).
  (cd "$staging" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  binary=$(find "$staging/node_modules/@deno" -mindepth 2 -maxdepth 2 -name deno -type f | head -n 1)
  [ -n "$binary" ] || { echo "no Deno binary for this platform in the npm packages" >&2; exit 1; }
  sudo_deno=()
  [ "$(id -u)" -eq 0 ] || sudo_deno=(sudo)
  # 0755 all the way: the sandbox binds the binary read-only and runs it as its own uid.
  "${sudo_deno[@]}" install -d -m 0755 "$deno_home" "$deno_home/bin"
  "${sudo_deno[@]}" install -m 0755 "$binary" "$deno_home/bin/deno.new"
  "${sudo_deno[@]}" mv -f "$deno_home/bin/deno.new" "$deno_home/bin/deno"
  [ "$(deno_current)" = "$deno_version" ] || { echo "Deno install failed" >&2; exit 1; }
else
  echo "==> Deno $deno_version present: $deno_home/bin/deno"
fi
if [ "$deno_home" != /opt/loopwright/deno ]; then
  echo "note: Deno is $deno_home/bin/deno; set LOOPWRIGHT_SANDBOX_DENO to it" >&2
fi

if [ "$(command -v node)" != "/usr/bin/node" ]; then
  echo "note: node is $(command -v node); set LOOPWRIGHT_SANDBOX_NODE and" \
    "LOOPWRIGHT_SANDBOX_EXTRA_RO_BINDS if it lives outside /usr" >&2
fi

# The smoke test of docs/sandbox.md: a failure here means unprivileged user namespaces are off
# (sysctl, AppArmor on Ubuntu >= 23.10, a container runtime) and skills will be refused.
if ! bwrap --unshare-all --die-with-parent --ro-bind /usr /usr --symlink usr/lib64 /lib64 \
  --symlink usr/lib /lib --symlink usr/bin /bin --proc /proc --dev /dev /usr/bin/true; then
  if [ "$(cat /proc/sys/kernel/apparmor_restrict_unprivileged_userns 2>/dev/null)" = 1 ]; then
    echo "warning: AppArmor (Ubuntu 23.10+) blocks bubblewrap's user namespaces, so skills are refused: add the bwrap profile of docs/sandbox.md" >&2
  else
    echo "warning: bubblewrap cannot create namespaces here; see docs/sandbox.md" >&2
  fi
fi
