#!/usr/bin/env bash
# `make docker-test`: the Docker image built and run for real, on a machine without an image
# registry or crates.io inside containers.
#
#   1. a Docker engine (dockerd started only if none answers, stopped at the end if so);
#   2. the images (images.sh all: local debootstrap base, vendored crates, Debian's Rust);
#   3. a root container and an nginx container (--network host, 127.0.0.1 only, free ports):
#      the root makes its admin token in its data volume and the sync token in a volume of
#      its own; nginx gets only that one (read-only), writes the token into a configuration
#      file only root can read, and serves packaging/nginx-yarl.conf's site with one worker;
#      other commands in the image run as the user yarl; a
#      quota made through the admin API with the admin token (and refused without it);
#      no answer for a Host the site does not serve; requests for the site until a 429
#      with Retry-After; the root's /metrics counts one limiter;
#   4. the cluster (cluster.sh up, under its own project name and free ports): two nginx at
#      60 req/s each share the 50 req/s quota: admitted per second across both is checked;
#   5. every container, network and volume it made removed, whatever happened.
#
# Every wait is bounded. Prints the time each step took and the image's size.
set -euo pipefail
cd "$(dirname "$0")/../.."
. packaging/docker/engine.sh

export YARL_IMAGE=${YARL_IMAGE:-yarl-rs:local} YARL_PG_IMAGE=${YARL_PG_IMAGE:-yarl-postgres:local}
run=yarl-test-$$
label=yarl-docker-test=$run
project=$run-cluster
tmp=$(mktemp -d /tmp/yarl-docker-test.XXXXXX)
cluster=no
t0=$SECONDS
say() { printf '\ndocker-test: %s\n' "$*"; }
fail() { echo "docker-test: FAIL: $*" >&2; exit 1; }

cleanup() {
    local rc=$? ids
    trap - EXIT INT TERM
    ids=$("$DOCKER" ps -aq --filter "label=$label" 2>/dev/null || true)
    if [ "$rc" != 0 ] && [ -n "$ids" ]; then
        for id in $ids; do
            echo "--- the end of $("$DOCKER" inspect -f '{{.Name}}' "$id")'s log" >&2
            "$DOCKER" logs --tail 20 "$id" >&2 2>&1 || true
        done
    fi
    # shellcheck disable=SC2086 # one id a word
    [ -z "$ids" ] || "$DOCKER" rm -f $ids >/dev/null || true
    ids=$("$DOCKER" volume ls -q --filter "label=$label" 2>/dev/null || true)
    # shellcheck disable=SC2086
    [ -z "$ids" ] || "$DOCKER" volume rm $ids >/dev/null || true
    if [ "$cluster" = yes ]; then
        [ "$rc" = 0 ] || YARL_CLUSTER_PROJECT=$project packaging/docker/cluster.sh status >&2 || true
        YARL_CLUSTER_PROJECT=$project packaging/docker/cluster.sh down || true
    fi
    if engine_answers; then
        local left
        left=$( { "$DOCKER" ps -aq --filter "label=$label"
            "$DOCKER" ps -aq --filter "label=com.docker.compose.project=$project"
            "$DOCKER" volume ls -q --filter "label=$label"
            "$DOCKER" volume ls -q --filter "label=com.docker.compose.project=$project"
            "$DOCKER" network ls -q --filter "label=com.docker.compose.project=$project"; } | wc -l)
        echo "docker-test: containers, volumes and networks of this run left: $left"
    fi
    engine_down
    rm -rf "$tmp"
    if [ "$rc" = 0 ]; then
        echo "docker-test: PASS in $((SECONDS - t0)) s"
    else
        echo "docker-test: FAIL (exit $rc) after $((SECONDS - t0)) s" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# N consecutive free ports on 127.0.0.1; prints the first.
free_ports() {
    local n=$1 base p ok
    for _ in $(seq 1 50); do
        base=$((20000 + RANDOM % 40000))
        ok=yes
        for p in $(seq "$base" $((base + n - 1))); do
            if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then ok=no; break; fi
        done
        [ "$ok" = no ] || { echo "$base"; return 0; }
    done
    fail "no $n free ports on 127.0.0.1"
}

# until SECONDS CMD...: runs CMD every 0.5 s until it succeeds, at most SECONDS.
until_ok() {
    local limit=$1
    shift
    for _ in $(seq 1 $((limit * 2))); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    return 1
}

say "engine"
engine_up

say "images"
t=$SECONDS
packaging/docker/images.sh all
t_images=$((SECONDS - t))
size=$("$DOCKER" image inspect -f '{{.Size}}' "$YARL_IMAGE" | awk '{ printf "%.0f MB", $1 / 1e6 }')
echo "docker-test: images ready in $t_images s; $YARL_IMAGE is $size"

############################################################################ root + nginx
say "a root container and an nginx container ($YARL_IMAGE, --network host)"
t=$SECONDS
base=$(free_ports 2)
root_port=$base nginx_port=$((base + 1))
root=http://127.0.0.1:$root_port
"$DOCKER" volume create --label "$label" "$run-data" >/dev/null
"$DOCKER" volume create --label "$label" "$run-sync" >/dev/null
"$DOCKER" run -d --name "$run-root" --label "$label" --network host \
    -e YARL_LISTEN="127.0.0.1:$root_port" -v "$run-data:/var/lib/yarl" \
    -v "$run-sync:/var/lib/yarl-sync" "$YARL_IMAGE" >/dev/null
until_ok 30 curl -fs "$root/healthz" || fail "the root does not answer $root/healthz"
"$DOCKER" logs "$run-root" 2>&1 | grep -E 'docker-entrypoint|listening' | sed 's/^/  root: /' || true
# The whole log first, then grep: `docker logs | grep -q` fails under pipefail when grep
# exits at its match and docker logs dies writing the rest (SIGPIPE).
root_log=$("$DOCKER" logs "$run-root" 2>&1)
grep -q 'admin token: /var/lib/yarl/admin.token' <<<"$root_log" \
    || fail "the entrypoint did not say where the admin token is"
grep -q 'sync token: /var/lib/yarl-sync/sync.token' <<<"$root_log" \
    || fail "the entrypoint did not put the sync token in /var/lib/yarl-sync"
admin=$("$DOCKER" exec "$run-root" cat /var/lib/yarl/admin.token)
[ ${#admin} = 64 ] || fail "admin token of ${#admin} characters, not 64"

quota='{"limit": 5, "low_burst": 7.5, "high_burst": 15, "parent": null}'
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X PUT "$root/v1/quotas/site_example.com" -d "$quota")
echo "  PUT /v1/quotas/site_example.com without the admin token: $code"
[ "$code" = 401 ] || fail "the admin API answered $code without a token, not 401"
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X POST "$root/v1/sync" -d '{}')
echo "  POST /v1/sync without the sync token: $code"
[ "$code" = 401 ] || fail "the sync route answered $code without a token, not 401"
echo "  PUT /v1/quotas/site_example.com with it: $(curl -fsS --max-time 5 -X PUT \
    -H "Authorization: Bearer $admin" "$root/v1/quotas/site_example.com" -d "$quota")"

# The image's nginx with Debian's module snippets and conf.d, but one worker (a light
# container; the cluster below runs two per nginx) and no stock site (it listens on *:80).
cat >"$tmp/nginx.conf" <<CONF
user www-data;
worker_processes 1;
pid /run/nginx.pid;
error_log stderr notice;
include /etc/nginx/modules-enabled/*.conf;
events { worker_connections 256; }
http {
    access_log off;
    include /etc/nginx/mime.types;
    include /etc/nginx/conf.d/*.conf;
}
CONF
sed "s/listen 8080\([ ;]\)/listen 127.0.0.1:$nginx_port\1/" packaging/nginx-yarl.conf >"$tmp/site.conf"
if ! grep -q "listen 127.0.0.1:$nginx_port default_server;" "$tmp/site.conf" \
    || ! grep -q "listen 127.0.0.1:$nginx_port;" "$tmp/site.conf" || grep -q 'listen 8080' "$tmp/site.conf"; then
    fail "packaging/nginx-yarl.conf no longer has the 'listen 8080' lines to move to 127.0.0.1"
fi
chmod 644 "$tmp/nginx.conf" "$tmp/site.conf"
"$DOCKER" run -d --name "$run-nginx" --label "$label" --network host \
    -e YARL_ROOTS="$root" -v "$run-sync:/var/lib/yarl-sync:ro" \
    -v "$tmp/nginx.conf:/etc/nginx/nginx.conf:ro" -v "$tmp/site.conf:/etc/nginx/conf.d/yarl.conf:ro" \
    "$YARL_IMAGE" nginx >/dev/null
site=http://127.0.0.1:$nginx_port
until_ok 30 curl -fs "$site/yarl/stats" || fail "nginx does not answer $site/yarl/stats"
"$DOCKER" logs "$run-nginx" 2>&1 | grep docker-entrypoint | sed 's/^/  nginx: /' || true
nginx_log=$("$DOCKER" logs "$run-nginx" 2>&1)
grep -q 'the sync token from /var/lib/yarl-sync/sync.token' <<<"$nginx_log" \
    || fail "the nginx entrypoint did not take the sync token from the sync token's volume"
mode=$("$DOCKER" exec "$run-nginx" stat -c '%a %U' /etc/nginx/conf.d/00-yarl-roots.conf)
echo "  /etc/nginx/conf.d/00-yarl-roots.conf (yarl_sync_token): $mode"
[ "$mode" = "600 root" ] || fail "the configuration holding the sync token is $mode, not 600 root"
user=$("$DOCKER" run --rm --label "$label" --network none "$YARL_IMAGE" id -un)
echo "  a command given to the image runs as: $user"
[ "$user" = yarl ] || fail "a command given to the image ran as $user, not yarl"

# A name the site does not serve gets no answer (444), rather than a quota of its own choice.
if out=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -H 'Host: unlimited.example' \
    "$site/index.nginx-debian.html"); then
    fail "a request for another Host got an answer ($out), not none (444)"
fi
echo "  a request for Host unlimited.example: no answer (444)"

# The quota reaches nginx at its next sync after the root's next poll (about 2 s).
echo "  requests for example.com to $site/index.nginx-debian.html (quota site_example.com: 5/s, bursts 7.5 and 15), until a 429:"
n=0 admitted=0 got=""
deadline=$((SECONDS + 30))
while [ "$n" -lt 600 ] && [ "$SECONDS" -lt "$deadline" ]; do
    n=$((n + 1))
    curl -s -D "$tmp/headers" -o /dev/null --max-time 5 -H 'Host: example.com' \
        "$site/index.nginx-debian.html" || true
    status=$(head -n 1 "$tmp/headers" | tr -d '\r')
    case "$status" in
    *" 429"*) got=yes; break ;;
    *" 200"*) admitted=$((admitted + 1)) ;;
    esac
    sleep 0.02
done
[ "$got" = yes ] || fail "no 429 after $n requests ($admitted admitted)"
retry_after=$(grep -i '^Retry-After:' "$tmp/headers" | tr -d '\r' | awk '{ print $2 }')
echo "  request $n (after $admitted admitted): $status, Retry-After: ${retry_after:-none}"
sed 's/^/    /' "$tmp/headers"
[[ "$retry_after" =~ ^[1-9][0-9]*$ ]] || fail "the 429 has no Retry-After of whole seconds >= 1"

metrics=$(curl -fs --max-time 5 "$root/metrics")
limiters=$(awk '$1 == "yarl_root_limiters" { print $2 }' <<<"$metrics")
grep -E '^yarl_root_(limiters|sync_requests_total)' <<<"$metrics" | sed 's/^/  root metrics: /'
[ "$limiters" = 1 ] || fail "yarl_root_limiters is ${limiters:-missing}, not 1 (one nginx)"
ok=$(awk '$1 == "yarl_root_sync_requests_total{result=\"ok\"}" { print $2 }' <<<"$metrics")
[ "${ok:-0}" -gt 0 ] || fail "no sync request accepted: the sync token did not get through"
"$DOCKER" rm -f "$run-nginx" "$run-root" >/dev/null
"$DOCKER" volume rm "$run-data" "$run-sync" >/dev/null
t_single=$((SECONDS - t))
echo "docker-test: root + nginx passed in $t_single s"

############################################################################ cluster
say "the cluster (cluster.sh up as $project)"
t=$SECONDS
base=$(free_ports 6)
export YARL_CLUSTER_PROJECT=$project YARL_CLUSTER_BUILD=no \
    ROOT_A_PORT=$base ROOT_B_PORT=$((base + 1)) \
    NGINX_A_PORT=$((base + 2)) APP_A_PORT=$((base + 3)) \
    NGINX_B_PORT=$((base + 4)) APP_B_PORT=$((base + 5))
cluster=yes
packaging/docker/cluster.sh up
packaging/docker/cluster.sh status >/dev/null || fail "the cluster is not up"
sleep 3    # the quotas reach both nginx (root poll, then a sync)
packaging/docker/cluster.sh traffic 60 15 | tee "$tmp/traffic"
read -r both a b < <(sed -n 's/^admitted per second from 5 s: both \([0-9.]*\) (nginx A \([0-9.]*\), nginx B \([0-9.]*\)).*/\1 \2 \3/p' "$tmp/traffic") || true
[ -n "${both:-}" ] || fail "no traffic summary"
# 120 req/s offered against 50/s; each nginx alone would admit 50/s, both ~100/s unshared.
awk -v x="$both" 'BEGIN { exit !(x >= 35 && x <= 65) }' \
    || fail "both nginx admitted $both/s together, not about 50/s"
awk -v a="$a" -v b="$b" 'BEGIN { exit !(a >= 5 && b >= 5) }' \
    || fail "one nginx admitted (almost) nothing: A $a/s, B $b/s"
packaging/docker/cluster.sh status | sed 's/^/  /'
for port in "$ROOT_A_PORT" "$ROOT_B_PORT"; do
    l=$(curl -fs --max-time 5 "http://127.0.0.1:$port/metrics" | awk '$1 == "yarl_root_limiters" { print $2 }')
    echo "  root 127.0.0.1:$port: yarl_root_limiters $l (2 nginx of 2 workers each, one limiter per nginx, and the 2 applications)"
    [ "${l:-0}" = 4 ] || fail "root $port counts ${l:-no} limiters, not 4 (2 nginx + 2 applications)"
done
packaging/docker/cluster.sh down
cluster=no
t_cluster=$((SECONDS - t))
echo "docker-test: cluster passed in $t_cluster s"

say "times: images $t_images s, root + nginx $t_single s, cluster $t_cluster s; $YARL_IMAGE $size"
"$DOCKER" system df
root_dir=$("$DOCKER" info -f '{{.DockerRootDir}}' 2>/dev/null || true)
echo "disk: $(du -sh "$root_dir" 2>/dev/null | cut -f1) in $root_dir, $(du -sh vendor | cut -f1) in vendor/"
