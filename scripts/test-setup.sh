#!/usr/bin/env bash
# What `npm test` needs on this machine, made true before the tests run: PostgreSQL and Redis on 127.0.0.1, and
# libvirt with QEMU for tests/kvm (software emulation where the host has no usable KVM). Every step checks first
# and does nothing when its part is there, so a ready machine pays well under a second. Installing needs root
# and apt (the only downloads are from the package registries); without root, it names what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '== test setup: %s\n' "$*" >&2; }
wait_for() { # wait_for <what> <seconds> <command…>: poll until the command succeeds, bounded
  local what=$1 limit=$2; shift 2
  for _ in $(seq 1 "$((limit * 5))"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  log "$what did not come up within ${limit}s"; return 1
}
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else
    log "needs root to run: $*  (run npm test as root once, or do it by hand)"; exit 1
  fi
}

apt_ready=
apt_install() {
  # apt cannot write its temporary files into a /tmp that is not world-writable, and then still exits 0 with stale
  # package lists: give it a directory it can use.
  if [ -z "$apt_ready" ] && [ "$(stat -c %a /tmp)" != 1777 ]; then export TMPDIR; TMPDIR=$(mktemp -d "$PWD/.apt-tmp.XXXXXX"); chmod 1777 "$TMPDIR"; trap 'rm -rf "$TMPDIR"' EXIT; fi
  [ -n "$apt_ready" ] || { as_root apt-get update -qq; apt_ready=1; }
  log "installing $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# --- PostgreSQL -------------------------------------------------------------------------------------------
if ! command -v pg_ctlcluster >/dev/null || ! command -v psql >/dev/null; then apt_install postgresql postgresql-client; fi
if ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  log "starting PostgreSQL"
  as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  wait_for PostgreSQL 60 pg_isready -h 127.0.0.1 -p 5432 -q
fi
# Tests connect as the OS user over TCP: make sure that role exists and may create databases.
if ! psql -h 127.0.0.1 -d postgres -Atc 'select 1' >/dev/null 2>&1; then
  as_root su postgres -c "psql -qc \"CREATE ROLE \\\"$(id -un)\\\" SUPERUSER LOGIN\"" || true
fi

# --- Redis ------------------------------------------------------------------------------------------------
if ! command -v redis-server >/dev/null; then apt_install redis-server; fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  log "starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no >/dev/null
  wait_for Redis 30 redis-cli -h 127.0.0.1 -p 6379 ping
fi

# --- libvirt and QEMU (tests/kvm), bubblewrap (the fake hosts' exec) --------------------------------------
pkgs=()
for pair in virsh:libvirt-clients libvirtd:libvirt-daemon-system qemu-system-x86_64:qemu-system-x86 qemu-img:qemu-utils \
  genisoimage:genisoimage busybox:busybox-static debugfs:e2fsprogs modinfo:kmod cpio:cpio xz:xz-utils ip:iproute2 nft:nftables \
  bwrap:bubblewrap; do
  command -v "${pair%%:*}" >/dev/null || pkgs+=("${pair#*:}")
done
dpkg -s libvirt-dev >/dev/null 2>&1 || pkgs+=(libvirt-dev)
if [ ${#pkgs[@]} -gt 0 ]; then apt_install "${pkgs[@]}"; fi
# Without udev, /dev/kvm stays root-only; libvirt then finds KVM "no longer available" on every call and
# re-probes QEMU's capabilities each time (seconds per call). Give it the group and mode udev's rule would.
if [ -e /dev/kvm ] && getent group kvm >/dev/null && [ "$(stat -c %G:%a /dev/kvm)" != "kvm:660" ]; then
  as_root chgrp kvm /dev/kvm && as_root chmod 660 /dev/kvm
fi
if ! pgrep -x libvirtd >/dev/null; then
  # libvirt's NAT network "default" would turn on forwarding and masquerading: it must never start here.
  as_root rm -f /etc/libvirt/qemu/networks/autostart/*.xml
  pgrep -x virtlogd >/dev/null || { log "starting virtlogd"; as_root virtlogd -d; }
  log "starting libvirtd"; as_root libvirtd -d
fi
wait_for libvirtd 90 virsh -c qemu:///system version

# The libvirt binding is an optional dependency built by `npm ci`. Where libvirt's headers came only now, npm ci
# either left the package out (its build failed, so npm dropped it) or kept it without its native part (it
# imports without it; making a Hypervisor loads it). Install the locked version, or rebuild it.
binding_ok() { node -e 'import("@unraid/libvirt").then((b) => new b.Hypervisor({ uri: "qemu:///system" })).then(() => process.exit(0), () => process.exit(1))' 2>/dev/null; }
if [ -d node_modules ] && ! binding_ok; then
  log "building the libvirt binding"
  out=$(mktemp)
  if [ -d node_modules/@unraid/libvirt ]; then
    npm rebuild @unraid/libvirt --foreground-scripts >"$out" 2>&1 || { cat "$out" >&2; rm -f "$out"; exit 1; }
  else
    version=$(node -p 'require("./package-lock.json").packages["node_modules/@unraid/libvirt"].version')
    npm install --no-save --no-audit --no-fund --foreground-scripts "@unraid/libvirt@$version" >"$out" 2>&1 ||
      { cat "$out" >&2; rm -f "$out"; exit 1; }
  fi
  rm -f "$out"
  binding_ok || { log "the libvirt binding still does not load"; exit 1; }
fi

# --- Chromium (tests/browser) -----------------------------------------------------------------------------
# Debian's package, driven by playwright-core; no browser is downloaded. CHROMIUM_PATH points elsewhere.
if [ -z "${CHROMIUM_PATH:-}" ] && [ ! -x /usr/lib/chromium/chromium ] && ! command -v chromium >/dev/null; then
  apt_install chromium fonts-liberation
fi
