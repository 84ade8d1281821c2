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
