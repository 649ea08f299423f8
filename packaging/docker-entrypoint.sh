#!/bin/sh
# Entrypoint of the YARL-rs image (Dockerfile). One image, two roles:
#
#   yarl-root [FLAGS]   the root server, as the user yarl; settings from YARL_<FLAG>
#                       variables (the image sets YARL_LISTEN=0.0.0.0:7700 and
#                       YARL_DB=sqlite:///var/lib/yarl/yarl.db)
#   nginx [ARGS]        Debian's nginx with ngx_http_yarl_module loaded, in the foreground;
#                       with YARL_ROOTS="http://root1:7700 http://root2:7700" it writes
#                       /etc/nginx/conf.d/00-yarl-roots.conf (yarl_roots, and yarl_sync_token
#                       from the file YARL_SYNC_TOKEN_FILE, yarl_sync_interval from
#                       YARL_SYNC_INTERVAL) so a mounted site configuration needs no root list
#
# Anything else is run as given.
set -eu

case "${1:-}" in
yarl-root)
    if [ "$(id -u)" = 0 ]; then
        exec setpriv --reuid=yarl --regid=yarl --init-groups "$@"
    fi
    exec "$@"
    ;;
nginx)
    if [ -n "${YARL_ROOTS:-}" ]; then
        conf=${YARL_NGINX_CONF_D:-/etc/nginx/conf.d}/00-yarl-roots.conf
        {
            echo "# written by docker-entrypoint.sh from YARL_ROOTS"
            echo "yarl_roots $YARL_ROOTS;"
            if [ -n "${YARL_SYNC_INTERVAL:-}" ]; then
                echo "yarl_sync_interval $YARL_SYNC_INTERVAL;"
            fi
            if [ -n "${YARL_SYNC_TOKEN_FILE:-}" ]; then
                echo "yarl_sync_token \"$(tr -d '\r\n' <"$YARL_SYNC_TOKEN_FILE")\";"
            fi
        } >"$conf"
    fi
    if [ $# -eq 1 ]; then
        set -- nginx -g 'daemon off;'
    fi
    exec "$@"
    ;;
*)
    exec "$@"
    ;;
esac
