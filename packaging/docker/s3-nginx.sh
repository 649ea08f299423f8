#!/bin/sh
# One nginx of the cluster in containers (docker-compose.yml), the entrypoint of its
# container (as root, which nginx's master needs) in the YARL-rs image: the
# S3 example (nginx-conf/s3.conf, which the image has as
# /usr/share/doc/yarl/examples/s3.conf): its balancer moved to the first port of
# S3_PORTS="BALANCER APP" and its upstream, the S3 application (yarl-s3-app, a container of
# its own), to the second (all on 127.0.0.1: the cluster uses the host's network, and two
# nginx cannot share ports), and its `yarl_roots` line replaced by the entrypoint's
# 00-yarl-roots.conf (YARL_ROOTS and the sync token). Error log to stderr and the
# balancer's access log to stdout (`docker logs`).
set -eu
src=${S3_CONF:-/usr/share/doc/yarl/examples/s3.conf}
prefix=/run/yarl-s3
roots_conf=${YARL_NGINX_CONF_D:-/etc/nginx/conf.d}/00-yarl-roots.conf
# shellcheck disable=SC2086
set -- ${S3_PORTS:?S3_PORTS=\"BALANCER APP\"}
[ $# -eq 2 ] || { echo "s3-nginx: S3_PORTS needs two ports, not '$S3_PORTS'" >&2; exit 1; }

mkdir -p "$prefix/logs"
ln -sf /usr/lib/nginx/modules/ngx_http_yarl_module.so "$prefix/ngx_http_yarl_module.so"
ln -sf /dev/stderr "$prefix/logs/error.log"
ln -sf /dev/stdout "$prefix/logs/access.json"
sed -e "s/127\.0\.0\.1:8080\([^0-9]\)/127.0.0.1:$1\1/g" \
    -e "s/127\.0\.0\.1:8081\([^0-9]\)/127.0.0.1:$2\1/g" \
    -e "s|^\([[:space:]]*\)yarl_roots[[:space:]].*;|\1include $roots_conf;|" \
    "$src" >"$prefix/nginx.conf"
# The example changed shape? Say so rather than run something else.
if ! grep -q "include $roots_conf;" "$prefix/nginx.conf" \
    || grep -Eq '127\.0\.0\.1:808[01]([^0-9]|$)' "$prefix/nginx.conf"; then
    echo "s3-nginx: $src no longer has the yarl_roots line or the 127.0.0.1:8080-8081 addresses this script moves" >&2
    exit 1
fi
echo "s3-nginx: $src on 127.0.0.1:$1 (balancer), the application on :$2" >&2
exec docker-entrypoint.sh nginx -p "$prefix/" -c nginx.conf -g 'daemon off;'
