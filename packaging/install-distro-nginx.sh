#!/usr/bin/env bash
# Installs the distribution's nginx and nginx-dev (Debian/Ubuntu), idempotently, without
# leaving a web server running: `make distro-module` needs the binary (to read `nginx -V` and
# to test-load the module) and the configured source tree nginx-dev ships in
# /usr/share/nginx/src, not a service on port 80.
#
# - Packages already installed: nothing happens (no apt-get, no service changes).
# - Otherwise they are installed with a policy-rc.d that forbids starting services (created
#   for the duration of the install when the machine has none, as Docker images do); if
#   nginx was not installed before, its boot-time start is then disabled again (an operator
#   who wants the distro nginx as a service enables it: `systemctl enable --now nginx`) and
#   an instance started anyway (a policy-rc.d that allowed it) is stopped.
set -euo pipefail

PACKAGES=(nginx nginx-dev)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=()
for p in "${PACKAGES[@]}"; do
    installed "$p" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "distro-deps: ${PACKAGES[*]} present ($(dpkg-query -W -f='${Version}' nginx))"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "distro-deps: missing ${missing[*]}; run as root or: apt-get install ${missing[*]}" >&2
    exit 1
fi

nginx_was_installed=0
installed nginx && nginx_was_installed=1

policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# temporary, from YARL-rs packaging/install-distro-nginx.sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
fi

echo "distro-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq "${missing[@]}" || { apt-get update -qq && apt-get install -y -qq "${missing[@]}"; }

if [ "$nginx_was_installed" = 0 ]; then
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
        systemctl disable --now nginx >/dev/null 2>&1 || true
    else
        if [ -s /run/nginx.pid ] && kill -0 "$(cat /run/nginx.pid)" 2>/dev/null; then
            service nginx stop >/dev/null 2>&1 || kill -QUIT "$(cat /run/nginx.pid)" || true
        fi
        command -v update-rc.d >/dev/null && update-rc.d nginx disable >/dev/null 2>&1 || true
    fi
    echo "distro-deps: nginx installed, not running and not started at boot"
fi
