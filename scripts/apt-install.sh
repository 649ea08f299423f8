#!/usr/bin/env bash
# usage: scripts/apt-install.sh [--no-install-recommends] PACKAGE...
#
# Installs those of the Debian packages that are missing, without leaving the services they
# bring running or started at boot. The build and the tests run their own nginx, PostgreSQL
# and Prometheus on loopback; the packages' services would hold their ports, and listen on
# every address (Prometheus on :9090, without authentication).
#
# - All present: nothing happens (no apt-get, no change to any service or setting).
# - A policy-rc.d that forbids starting services is in place during the install (one made
#   for it when the machine has none, as Docker images do).
# - When it installs postgresql-common too, it sets create_main_cluster = false in its
#   createcluster.conf before a server package could make the "main" cluster (the tests make
#   throwaway clusters of their own: scripts/with-postgres.sh). An installed
#   postgresql-common's setting is left as it is.
# - A package installed now whose service has its name (nginx, prometheus, postgresql) is
#   then disabled and stopped: `systemctl enable --now NAME` runs it as a service.
set -euo pipefail

apt_args=()
if [ "${1:-}" = --no-install-recommends ]; then
    apt_args+=("$1")
    shift
fi

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=()
for p in "$@"; do
    installed "$p" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "apt-install: missing ${missing[*]}; run as root or: apt-get install ${missing[*]}" >&2
    exit 1
fi

policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# temporary, from YARL-rs scripts/apt-install.sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
fi

export DEBIAN_FRONTEND=noninteractive
apt_install() { apt-get install -y -qq "${apt_args[@]}" "$@"; }

echo "apt-install: installing ${missing[*]}"
apt-get update -qq
if printf '%s\n' "${missing[@]}" | grep -q '^postgresql' && ! installed postgresql-common; then
    apt_install postgresql-common
    conf=/etc/postgresql-common/createcluster.conf
    if grep -Eq '^#?[[:space:]]*create_main_cluster[[:space:]]*=' "$conf"; then
        sed -ri 's/^#?[[:space:]]*create_main_cluster[[:space:]]*=.*/create_main_cluster = false/' "$conf"
    else
        echo 'create_main_cluster = false' >>"$conf"
    fi
    echo "apt-install: $conf: create_main_cluster = false (no cluster made by the package)"
fi
apt_install "${missing[@]}"

for p in "${missing[@]}"; do
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
        [ -e "/lib/systemd/system/$p.service" ] || continue
        systemctl disable --now "$p" >/dev/null 2>&1 || true
    else
        [ -e "/etc/init.d/$p" ] || continue
        service "$p" stop >/dev/null 2>&1 || true
        if command -v update-rc.d >/dev/null; then
            update-rc.d "$p" disable >/dev/null 2>&1 || true
        fi
    fi
    echo "apt-install: $p installed, its service not running and not started at boot"
done
