#!/usr/bin/env bash
# Installs what `make test-arm64` needs, idempotently (a stamp per step; rerunning does nothing that is done):
#   host  Debian packages: qemu-user-static + binfmt-support (run arm64 binaries), mmdebstrap (the arm64 root),
#         gcc-aarch64-linux-gnu (the wheel's C extension for aarch64); binfmt_misc mounted and qemu-aarch64 enabled.
#   root  An aarch64 Debian trixie root under $ARM64_ROOT (mmdebstrap, ~8 min, ~200 MiB), from the mirror the
#         host's apt already uses, with a venv at /opt/venv holding the test tools (pinned by requirements-dev.txt).
#   run   CMD... inside the root (chroot in a private mount namespace: /proc, /dev, /tmp and the checkout are bound
#         in and go away with the process).
# Needs root (apt-get, mount, chroot), as the cluster suite does.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# Under build/ (never in the repo); the leading _ keeps `go ... ./...` from walking it.
ARM64_ROOT=${ARM64_ROOT:-$here/build/_arm64root}
SUITE=trixie
# The host's CA bundle goes into the root: pip inside it must trust what pip outside trusts.
CA_BUNDLE=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}

log() { echo "arm64/setup.sh: $*" >&2; }

# The Debian mirror apt uses on this host (deb822 or one-line sources), unless ARM64_MIRROR says otherwise.
mirror() {
  if [ -n "${ARM64_MIRROR:-}" ]; then echo "$ARM64_MIRROR"; return; fi
  local m
  m=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ {print $2}' | grep -v -- '-security' | grep -m1 debian || true)
  [ -n "$m" ] || m=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}' | grep -v -- '-security' | grep -m1 debian || true)
  echo "${m:-http://deb.debian.org/debian}"
}

host() {
  local need=()
  command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
  command -v update-binfmts >/dev/null || need+=(binfmt-support)
  command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
  command -v arch-test >/dev/null || need+=(arch-test)  # mmdebstrap checks foreign-architecture support with it
  command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
  command -v file >/dev/null || need+=(file)
  if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  binfmt
}

# binfmt_misc is per kernel (not per container): mounted once, then qemu-aarch64 registered with the F flag
# (the interpreter is opened at registration, so arm64 binaries run inside a chroot too).
binfmt() {
  if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  fi
  if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    update-binfmts --enable qemu-aarch64 || update-binfmts --import qemu-aarch64
  fi
  grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64 || { log "qemu-aarch64 binfmt not enabled"; exit 1; }
}

root() {
  host
  if [ ! -e "$ARM64_ROOT/.stamp-base" ]; then
    local t0=$SECONDS m
    m=$(mirror)
    log "building the aarch64 $SUITE root in $ARM64_ROOT from $m (~8 min)"
    rm -rf "$ARM64_ROOT"
    mkdir -p "$(dirname "$ARM64_ROOT")"
    mmdebstrap --quiet --architectures=arm64 --variant=apt \
      --include=python3,python3-venv,python3-pip,ca-certificates,libatomic1 \
      "$SUITE" "$ARM64_ROOT" "deb $m $SUITE main"
    log "root built in $((SECONDS - t0)) s"
    touch "$ARM64_ROOT/.stamp-base"
  fi
  local req=$here/pybind/requirements-dev.txt stamp=$ARM64_ROOT/.stamp-venv
  if [ ! -e "$stamp" ] || ! cmp -s "$req" "$stamp"; then
    local t0=$SECONDS
    log "installing the test tools into the root's /opt/venv (under qemu)"
    cp "$CA_BUNDLE" "$ARM64_ROOT/etc/ssl/certs/host-ca.crt"
    cp "$req" "$ARM64_ROOT/opt/requirements-dev.txt"
    run sh -c 'rm -rf /opt/venv && python3 -m venv /opt/venv &&
      PIP_CERT=/etc/ssl/certs/host-ca.crt /opt/venv/bin/python -m pip install -q --only-binary=:all: \
        -c /opt/requirements-dev.txt pytest flatbuffers numpy msgspec pyzmq'
    cp "$req" "$stamp"
    log "venv installed in $((SECONDS - t0)) s"
  fi
}

# run CMD...: CMD inside the root, the checkout bound at /src, the host's /tmp as the root's /tmp.
run() {
  [ -e "$ARM64_ROOT/.stamp-base" ] || { log "no root at $ARM64_ROOT: run '$0 root' first"; exit 1; }
  mkdir -p "$ARM64_ROOT/src"
  ARM64_ROOT=$ARM64_ROOT SRC=$here unshare --mount --propagation private -- sh -c '
    set -e
    mount --rbind /proc "$ARM64_ROOT/proc"
    mount --rbind /dev "$ARM64_ROOT/dev"
    mount -t tmpfs -o mode=1777 tmpfs "$ARM64_ROOT/tmp"
    mount --bind "$SRC" "$ARM64_ROOT/src"
    exec chroot "$ARM64_ROOT" env -i PATH=/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"
  ' sh "$@"
}

case "${1:-}" in
  host) host ;;
  root) root ;;
  mirror) mirror ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 host|root|mirror|run CMD..." >&2; exit 2 ;;
esac
