#!/usr/bin/env bash
# Prepares an nginx build directory that matches an installed nginx binary, for building
# ngx_http_yarl_module.so with NGINX_BUILD_DIR=<build dir>/objs (the `ngx` crate's bindgen
# reads objs/Makefile and objs/ngx_auto_config.h; nothing is compiled here).
#
#   packaging/configure-nginx.sh NGINX_BINARY NGINX_SOURCE BUILD_DIR
#
# NGINX_SOURCE is the source of exactly the binary's version: Debian/Ubuntu's nginx-dev
# ships it in /usr/share/nginx/src (headers, auto/, configure), otherwise unpack
# nginx-<version>.tar.gz from nginx.org (or `apt-get source nginx`). It is copied to
# BUILD_DIR and configured there with the arguments `NGINX_BINARY -V` prints, so the module
# gets the same version number and the same binary-compatibility signature as the binary
# (nginx refuses a module otherwise: "version X instead of Y" / "is not binary compatible").
# Third-party --add-module/--add-dynamic-module paths are dropped: they are built separately
# and do not change the structures or the signature a module sees.
#
# Idempotent: when the binary's `nginx -V` and the source are unchanged since the last run,
# the build directory is left as it is (reconfiguring would make cargo rebuild nginx-sys).
set -euo pipefail

if [ $# -ne 3 ]; then
    echo "usage: $0 NGINX_BINARY NGINX_SOURCE BUILD_DIR" >&2
    exit 2
fi
nginx=$1 src=$2 build=$3

[ -x "$nginx" ] || { echo "configure-nginx: $nginx is not an executable nginx" >&2; exit 1; }
[ -f "$src/src/core/nginx.h" ] && [ -x "$src/configure" ] || {
    echo "configure-nginx: $src is not an nginx source tree (no src/core/nginx.h or configure)" >&2
    exit 1
}

v_out=$("$nginx" -V 2>&1)
bin_version=$(sed -n 's|^nginx version: [^/]*/\([0-9.]*\).*|\1|p' <<<"$v_out")
src_version=$(sed -n 's/^#define NGINX_VERSION *"\(.*\)"/\1/p' "$src/src/core/nginx.h")
args=$(sed -n 's/^configure arguments: //p' <<<"$v_out")
if [ -z "$bin_version" ]; then
    echo "configure-nginx: cannot read the version from '$nginx -V':" >&2
    echo "$v_out" >&2
    exit 1
fi
if [ "$bin_version" != "$src_version" ]; then
    echo "configure-nginx: $nginx is nginx $bin_version but $src is nginx $src_version;" >&2
    echo "  a module built from it would fail to load with \"version ... instead of ...\"." >&2
    echo "  Use the source of nginx $bin_version." >&2
    exit 1
fi

stamp_text=$(printf '%s\n%s\n%s\n' "$v_out" "$(cd "$src" && pwd)" "$(cksum <"$src/src/core/nginx.h")" \
    && cksum <"$0")
stamp=$build/yarl-configure.stamp
if [ -f "$build/objs/ngx_auto_config.h" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_text" ]; then
    echo "configure-nginx: $build/objs is configured for $nginx (nginx $bin_version)"
    exit 0
fi

# The arguments exactly as the binary reports them (quoted the way a shell reads them).
eval "set -- $args"
keep=()
for a in "$@"; do
    case $a in
        --add-module=* | --add-dynamic-module=*)
            echo "configure-nginx: dropping $a (third-party module, not needed for the ABI)" ;;
        --builddir=*) ;;
        *) keep+=("$a") ;;
    esac
done
case " ${keep[*]} " in
    *" --with-compat "*) ;;
    *) echo "configure-nginx: note: $nginx was built without --with-compat; the module" \
        "matches it only because it is configured with the very same arguments" ;;
esac

rm -rf "$build"
mkdir -p "$build"
cp -a "$src/." "$build/"
rm -rf "$build/objs" "$build/Makefile"
echo "configure-nginx: configuring nginx $bin_version in $build with the arguments of $nginx -V"
if ! (cd "$build" && ./configure "${keep[@]}") >"$build/configure.log" 2>&1; then
    tail -n 20 "$build/configure.log" >&2
    echo "configure-nginx: configure failed (log: $build/configure.log); install the -dev" \
        "packages of the libraries it names (Debian: nginx-dev depends on all of them)" >&2
    exit 1
fi
printf '%s\n' "$stamp_text" >"$stamp"
echo "configure-nginx: done: NGINX_BUILD_DIR=$build/objs"
