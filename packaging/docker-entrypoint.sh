#!/bin/sh
# Entrypoint of the YARL-rs image (Dockerfile). One image, two roles:
#
#   yarl-root [FLAGS]   the root server, as the user yarl; settings from YARL_<FLAG>
#                       variables (the image sets YARL_LISTEN=0.0.0.0:7700 and
#                       YARL_DB=sqlite:///var/lib/yarl/yarl.db). Tokens: each token file not
#                       given (YARL_ADMIN_TOKEN_FILE or --admin-token-file, YARL_SYNC_TOKEN_FILE
#                       or --sync-token-file) is made with a random token on first start and
#                       kept afterwards; the log says where they are. The admin token is
#                       /var/lib/yarl/admin.token (YARL_TOKEN_DIR), beside the database; the
#                       sync token /var/lib/yarl-sync/sync.token (YARL_SYNC_TOKEN_DIR), in a
#                       volume of its own: nginx and applications get that one alone, never
#                       the admin token. --insecure-no-auth (or YARL_INSECURE_NO_AUTH) makes
#                       none.
#   nginx [ARGS]        Debian's nginx with ngx_http_yarl_module loaded, in the foreground;
#                       with YARL_ROOTS="http://root1:7700 http://root2:7700" it writes
#                       /etc/nginx/conf.d/00-yarl-roots.conf (yarl_roots, yarl_sync_interval
#                       from YARL_SYNC_INTERVAL, and yarl_sync_token from the file
#                       YARL_SYNC_TOKEN_FILE, waited for up to YARL_TOKEN_WAIT seconds (30),
#                       or else from /var/lib/yarl-sync/sync.token when the roots' sync token
#                       volume is mounted there) so a mounted site configuration needs no
#                       root list. nginx starts as root (to bind its ports) and its workers
#                       run as the configuration's `user`.
#
# Anything else (yarl-s3-app, a shell, ...) runs as the user yarl: nothing in the image
# needs root but nginx's master. `docker exec` or `--entrypoint` give a root shell.
set -eu

token_dir=${YARL_TOKEN_DIR:-/var/lib/yarl}
sync_dir=${YARL_SYNC_TOKEN_DIR:-/var/lib/yarl-sync}

say() { echo "docker-entrypoint: $*" >&2; }

as_yarl() {
    if [ "$(id -u)" = 0 ]; then
        exec setpriv --reuid=yarl --regid=yarl --init-groups "$@"
    fi
    exec "$@"
}

# make_token FILE: a random token (64 hex digits) in FILE unless it has one, 0640 root:yarl
# (what yarl-root expects of a token file: the service reads it through its group). Two
# roots sharing the volume may start at once: the file appears whole (ln) and the first one
# wins.
make_token() {
    [ -s "$1" ] && return 0
    tmp=$(mktemp "$1.XXXXXX")
    od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$tmp"
    echo >>"$tmp"
    chmod 0640 "$tmp"
    if [ "$(id -u)" = 0 ] && id yarl >/dev/null 2>&1; then
        chown root:yarl "$tmp"
    fi
    if ln "$tmp" "$1" 2>/dev/null; then
        say "created $1 (a random token)"
    fi
    rm -f "$tmp"
}

case "${1:-}" in
yarl-root)
    admin=${YARL_ADMIN_TOKEN_FILE:-}
    sync=${YARL_SYNC_TOKEN_FILE:-}
    insecure=no
    case "${YARL_INSECURE_NO_AUTH:-}" in
    "" | 0 | false | no | off | n | f) ;;
    *) insecure=yes ;;
    esac
    for arg in "$@"; do
        case "$arg" in
        --admin-token-file | --admin-token-file=*) admin=given ;;
        --sync-token-file | --sync-token-file=*) sync=given ;;
        --insecure-no-auth | --insecure-no-auth=*) insecure=yes ;;
        esac
    done
    if [ "$insecure" = no ]; then
        if [ -z "$admin" ]; then
            make_token "$token_dir/admin.token"
            export YARL_ADMIN_TOKEN_FILE="$token_dir/admin.token"
            say "admin token: $YARL_ADMIN_TOKEN_FILE (curl -H \"Authorization: Bearer \$(cat $YARL_ADMIN_TOKEN_FILE)\" ...)"
        fi
        if [ -z "$sync" ]; then
            make_token "$sync_dir/sync.token"
            export YARL_SYNC_TOKEN_FILE="$sync_dir/sync.token"
            say "sync token: $YARL_SYNC_TOKEN_FILE (nginx: yarl_sync_token; the image's nginx and applications read it with this volume, and no other, mounted at $sync_dir)"
        fi
    fi
    as_yarl "$@"
    ;;
nginx)
    if [ -n "${YARL_ROOTS:-}" ]; then
        token_file=${YARL_SYNC_TOKEN_FILE:-}
        if [ -n "$token_file" ]; then
            # The roots may be making it right now (first start).
            i=0
            while [ ! -s "$token_file" ] && [ "$i" -lt "${YARL_TOKEN_WAIT:-30}" ]; do
                [ "$i" != 0 ] || say "waiting for $token_file"
                sleep 1
                i=$((i + 1))
            done
            if [ ! -s "$token_file" ]; then
                say "YARL_SYNC_TOKEN_FILE $token_file does not exist or is empty"
                exit 1
            fi
        elif [ -s "$sync_dir/sync.token" ]; then
            token_file=$sync_dir/sync.token
        fi
        if [ -e "$token_dir/admin.token" ]; then
            say "warning: $token_dir/admin.token is in this container: mount only the sync token's volume (at $sync_dir) into nginx, not the root's data volume"
        fi
        token=""
        if [ -n "$token_file" ]; then
            token=$(tr -d '\r\n' <"$token_file")
            case "$token" in
            *[!A-Za-z0-9._~+/=-]*)
                say "the token in $token_file has characters other than A-Z a-z 0-9 . _ ~ + / = -"
                exit 1
                ;;
            esac
        fi
        conf=${YARL_NGINX_CONF_D:-/etc/nginx/conf.d}/00-yarl-roots.conf
        # The token in it is the cluster's: for nginx's master (root) alone, also when an
        # earlier start left the file with another mode.
        rm -f "$conf"
        (
            umask 077
            {
                echo "# written by docker-entrypoint.sh from YARL_ROOTS"
                echo "yarl_roots $YARL_ROOTS;"
                if [ -n "${YARL_SYNC_INTERVAL:-}" ]; then
                    echo "yarl_sync_interval $YARL_SYNC_INTERVAL;"
                fi
                if [ -n "$token" ]; then
                    echo "yarl_sync_token \"$token\";"
                fi
            } >"$conf"
        )
        say "$conf: yarl_roots $YARL_ROOTS${token:+, the sync token from $token_file}"
    fi
    if [ $# -eq 1 ]; then
        set -- nginx -g 'daemon off;'
    fi
    exec "$@"
    ;;
*)
    as_yarl "$@"
    ;;
esac
