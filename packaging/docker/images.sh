#!/usr/bin/env bash
# usage: images.sh [base|yarl|all]   (default yarl)
#
# Builds the YARL-rs image (and, with `all`, the cluster's PostgreSQL image) on a machine
# without an image registry or crates.io inside containers: `make docker-image`, and the
# first step of `make docker-test` and `make docker-cluster`.
#
#   1. a base image made with debootstrap from the Debian mirror apt uses (DOCKER_BASE=local,
#      the default; built once, then reused: `docker rmi yarl-local/debian:12` renews it),
#      or debian:12 and debian:12-slim from the registry (DOCKER_BASE=registry);
#   2. the crates of Cargo.lock in vendor/ (cargo vendor on this host; git-ignored);
#   3. `docker build` of the Dockerfile (legacy builder) with Rust from Debian's rustc-web
#      and cargo-web (DOCKER_RUST=debian, the default: the newest in Debian 12, from
#      bookworm-security; DOCKER_RUST_RELEASE=bookworm takes bookworm's 1.85, too old for
#      some crates of Cargo.lock today) or from rustup (DOCKER_RUST=rustup), tagged
#      $YARL_IMAGE (default yarl-rs:local); its build stage, the next build's cache, tagged
#      $YARL_BUILD_IMAGE (yarl-rs-build:local); untagged stages of earlier builds removed;
#   4. with `all`, packaging/docker/postgres.Dockerfile on the same base, tagged
#      $YARL_PG_IMAGE (default yarl-postgres:local).
#
# Starts dockerd when no engine answers, and stops it at the end (engine.sh). Prints the
# time each step took.
set -euo pipefail
cd "$(dirname "$0")/../.."
. packaging/docker/engine.sh

DOCKER_BASE=${DOCKER_BASE:-local}
DOCKER_RUST=${DOCKER_RUST:-debian}
DOCKER_RUST_RELEASE=${DOCKER_RUST_RELEASE:-}
LOCAL_BASE=${LOCAL_BASE:-yarl-local/debian:12}
YARL_IMAGE=${YARL_IMAGE:-yarl-rs:local}
YARL_BUILD_IMAGE=${YARL_BUILD_IMAGE:-yarl-rs-build:local}
YARL_PG_IMAGE=${YARL_PG_IMAGE:-yarl-postgres:local}
CARGO=${CARGO:-cargo}
what=${1:-yarl}
case "$what" in
base | yarl | all) ;;
*) echo "usage: $0 [base|yarl|all]" >&2; exit 2 ;;
esac

base_tmp=""
cleanup() {
    [ -z "$base_tmp" ] || rm -rf "$base_tmp"
    engine_down
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
engine_up

step_start=0
step() { step_start=$SECONDS; echo "images: $*"; }
step_done() { echo "images: ... $(( SECONDS - step_start )) s"; }

# The mirrors this host's apt uses (deb822 or one-line sources), else deb.debian.org.
apt_mirror() {
    local suite=$1 fallback=$2 uri
    uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v s="$suite" '
        /^URIs:/ { u = $2 } /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s) { print u; exit } }
        /^$/ { u = "" }')
    if [ -z "$uri" ]; then
        uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
            | awk -v s="$suite" '$1 == "deb" && $3 == s { print $2; exit }')
    fi
    echo "${uri:-$fallback}"
}

make_local_base() {
    if "$DOCKER" image inspect "$LOCAL_BASE" >/dev/null 2>&1; then
        echo "images: base $LOCAL_BASE present ($("$DOCKER" image inspect -f '{{.Created}}' "$LOCAL_BASE" | cut -c1-10))"
        return 0
    fi
    local mirror security
    mirror=${DEBIAN_MIRROR:-$(apt_mirror bookworm http://deb.debian.org/debian)}
    security=${DEBIAN_SECURITY_MIRROR:-$(apt_mirror bookworm-security http://deb.debian.org/debian-security)}
    step "base $LOCAL_BASE: debootstrap --variant=minbase bookworm from $mirror"
    base_tmp=$(mktemp -d /var/tmp/yarl-base.XXXXXX)
    local r=$base_tmp/rootfs
    if ! debootstrap --variant=minbase bookworm "$r" "$mirror" >"$base_tmp/debootstrap.log" 2>&1; then
        tail -n 30 "$base_tmp/debootstrap.log" >&2
        [ ! -f "$r/debootstrap/debootstrap.log" ] || tail -n 30 "$r/debootstrap/debootstrap.log" >&2
        return 1
    fi
    # What the registry's debian:12-slim has: the three suites, apt and dpkg set for images
    # (no documentation, man pages or translations; no package cache left behind).
    rm -f "$r/etc/apt/sources.list"
    cat >"$r/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
    cat >"$r/etc/apt/apt.conf.d/docker-clean" <<'APT'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
APT
    echo 'Acquire::Languages "none";' >"$r/etc/apt/apt.conf.d/docker-no-languages"
    cat >"$r/etc/dpkg/dpkg.cfg.d/docker" <<'DPKG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
DPKG
    find "$r/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    find "$r/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "$r/usr/share/man/"* "$r/usr/share/info/"* "$r/usr/share/locale/"* \
        "$r/var/lib/apt/lists/"* "$r/var/cache/apt/"*.bin "$r/var/cache/apt/archives/"*.deb \
        "$r/var/log/"*.log "$r/var/log/apt/"* "$r/etc/resolv.conf" "$r/etc/hostname"
    : >"$r/etc/machine-id"
    tar --numeric-owner --xattrs -C "$r" -c . | "$DOCKER" import \
        --change 'CMD ["bash"]' \
        --change "LABEL org.opencontainers.image.description=\"Debian 12 minbase from $mirror (debootstrap, packaging/docker/images.sh)\"" \
        - "$LOCAL_BASE" >/dev/null
    rm -rf "$base_tmp"
    base_tmp=""
    step_done
    echo "images: base $LOCAL_BASE $("$DOCKER" image inspect -f '{{.Size}}' "$LOCAL_BASE" | awk '{ printf "%.0f MB", $1 / 1e6 }')"
}

case "$DOCKER_BASE" in
local)
    make_local_base
    BASE_IMAGE=$LOCAL_BASE RUNTIME_IMAGE=$LOCAL_BASE
    ;;
registry)
    BASE_IMAGE=debian:12 RUNTIME_IMAGE=debian:12-slim
    ;;
*)
    echo "images: DOCKER_BASE must be local or registry, not '$DOCKER_BASE'" >&2
    exit 2
    ;;
esac
[ "$what" != base ] || exit 0

step "crates of Cargo.lock into vendor/ (cargo vendor --locked)"
"$CARGO" vendor --locked vendor >/dev/null 2>"$ENGINE_DIR/vendor.log" \
    || { tail -n 20 "$ENGINE_DIR/vendor.log" >&2; exit 1; }
step_done

step "docker build -t $YARL_IMAGE (base $BASE_IMAGE, Rust from $DOCKER_RUST${DOCKER_RUST_RELEASE:+ ($DOCKER_RUST_RELEASE)})"
# The legacy builder (BuildKit needs the buildx plugin); only its "Step n/m" lines shown,
# the whole log in $ENGINE_DIR/build.log.
build() {
    local log=$1
    shift
    DOCKER_BUILDKIT=0 "$DOCKER" build --force-rm "$@" 2>&1 | tee "$log" \
        | awk '/^Step / { print "  " substr($0, 1, 100); fflush() }' || true
    if ! grep -q '^Successfully tagged' "$log"; then
        echo "images: docker build failed; the end of $log:" >&2
        tail -n 40 "$log" >&2
        exit 1
    fi
}
build "$ENGINE_DIR/build.log" -t "$YARL_IMAGE" \
    --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg RUNTIME_IMAGE="$RUNTIME_IMAGE" \
    --build-arg RUST_FROM="$DOCKER_RUST" --build-arg DEBIAN_RUST_RELEASE="$DOCKER_RUST_RELEASE" .
step_done
echo "images: $YARL_IMAGE $("$DOCKER" image inspect -f '{{.Size}}' "$YARL_IMAGE" | awk '{ printf "%.0f MB", $1 / 1e6 }')"
# The build stage (about 4 GB: the compiled workspace) is the next build's cache: tagged, it
# stays; the build and runtime stages of earlier sources are untagged now, and dropped.
build "$ENGINE_DIR/build-stage.log" --target build -t "$YARL_BUILD_IMAGE" \
    --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg RUNTIME_IMAGE="$RUNTIME_IMAGE" \
    --build-arg RUST_FROM="$DOCKER_RUST" --build-arg DEBIAN_RUST_RELEASE="$DOCKER_RUST_RELEASE" . >/dev/null
echo "images: earlier builds dropped: $("$DOCKER" image prune -f --filter label=org.yarl-rs.stage | tail -n 1)"

if [ "$what" = all ]; then
    step "docker build -t $YARL_PG_IMAGE (Debian's postgresql on $RUNTIME_IMAGE)"
    build "$ENGINE_DIR/build-postgres.log" -t "$YARL_PG_IMAGE" --build-arg BASE_IMAGE="$RUNTIME_IMAGE" \
        -f packaging/docker/postgres.Dockerfile packaging/docker
    step_done
fi
