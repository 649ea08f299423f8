#!/usr/bin/env bash
# Loads a built ngx_http_yarl_module.so into an nginx binary with `nginx -t` (a throwaway
# prefix and configuration that uses the module's directives; nothing listens, nothing of
# the system's nginx configuration is read or written) and prints what nginx says.
#
#   packaging/check-module-load.sh NGINX_BINARY MODULE_SO
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 NGINX_BINARY MODULE_SO" >&2; exit 2; }
nginx=$1
so=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
[ -f "$so" ] || { echo "check-module-load: $so does not exist" >&2; exit 1; }

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/logs"
cat >"$dir/nginx.conf" <<CONF
load_module $so;
pid $dir/nginx.pid;
lock_file $dir/nginx.lock;
error_log stderr notice;
events {}
http {
    access_log off;
    client_body_temp_path $dir/client_body_temp;
    proxy_temp_path $dir/proxy_temp;
    fastcgi_temp_path $dir/fastcgi_temp;
    uwsgi_temp_path $dir/uwsgi_temp;
    scgi_temp_path $dir/scgi_temp;
    yarl_roots http://127.0.0.1:7700;
    yarl_sync_interval 1s;
    server {
        listen 127.0.0.1:1;
        location / { yarl_check "check_\$host"; yarl_account app 1; return 204; }
        location /yarl/stats { yarl_stats; }
    }
}
CONF
echo "\$ $nginx -V"
"$nginx" -V 2>&1
echo "\$ $nginx -t -p $dir/ -c $dir/nginx.conf     # load_module $so"
if ! "$nginx" -t -p "$dir/" -c "$dir/nginx.conf" 2>&1; then
    echo "check-module-load: $nginx refused $so (see docs: README, 'Building against an installed nginx')" >&2
    exit 1
fi
