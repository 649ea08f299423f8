#!/usr/bin/env bash
# Installs the distribution's nginx and nginx-dev (Debian/Ubuntu), idempotently, without
# leaving a web server running: `make distro-module` needs the binary (to read `nginx -V` and
# to test-load the module) and the configured source tree nginx-dev ships in
# /usr/share/nginx/src, not a service on port 80.
#
# Packages already installed: nothing happens. Otherwise scripts/apt-install.sh installs
# them with services forbidden to start, and an nginx it installed is left disabled and
# stopped (an operator who wants the distro nginx as a service enables it:
# `systemctl enable --now nginx`).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/apt-install.sh nginx nginx-dev
echo "distro-deps: nginx nginx-dev present ($(dpkg-query -W -f='${Version}' nginx))"
