#!/usr/bin/env bash
# usage: cluster.sh up | traffic [RATE [SECONDS]] | status | down
#
# A YARL cluster in containers (docker-compose.yml beside this): PostgreSQL, two roots sharing
# it, and two nginx with the S3 example, each syncing with both roots; everything on
# 127.0.0.1. `make docker-cluster` runs `up`, `make docker-cluster-down` runs `down`.
#
#   up       starts a Docker engine if none answers (left running for the cluster: `down`
#            stops it), builds the images (images.sh all: no image registry needed), starts
#            the cluster, creates the example quotas through root A's admin API with the
#            token the roots made, and prints how to send traffic and what to watch
#   traffic  RATE requests/s (default 60) to each nginx at once for SECONDS (default 20),
#            then the requests admitted per second by each nginx and by both together
#   status   the containers, and what each root counts (limiters, syncs)
#   down     stops and removes the cluster's containers, network and volumes, and the
#            dockerd `up` started, if it did
#
# Environment: YARL_CLUSTER_PROJECT (compose project, default yarl-cluster); the ports
# ROOT_A_PORT, ROOT_B_PORT (7701, 7702), NGINX_A_PORT, APP_A_PORT, NGINX_B_PORT, APP_B_PORT
# (8181, 8182, 8281, 8282: each S3 balancer and the application behind it); YARL_CLUSTER_BUILD=no
# to use the images as they are; images.sh's variables (DOCKER_BASE, DOCKER_RUST, ...).
set -euo pipefail
cd "$(dirname "$0")/../.."
ENGINE_PIDFILE=$PWD/.run/docker/cluster-dockerd.pid
. packaging/docker/engine.sh

export COMPOSE_PROJECT_NAME=${YARL_CLUSTER_PROJECT:-yarl-cluster}
export ROOT_A_PORT=${ROOT_A_PORT:-7701} ROOT_B_PORT=${ROOT_B_PORT:-7702}
export NGINX_A_PORT=${NGINX_A_PORT:-8181} APP_A_PORT=${APP_A_PORT:-8182}
export NGINX_B_PORT=${NGINX_B_PORT:-8281} APP_B_PORT=${APP_B_PORT:-8282}
export YARL_IMAGE=${YARL_IMAGE:-yarl-rs:local} YARL_PG_IMAGE=${YARL_PG_IMAGE:-yarl-postgres:local}
NGINX_A=$NGINX_A_PORT
NGINX_B=$NGINX_B_PORT
# The quota both nginx share (s3.conf's example; its parent s3_photos allows 100/s).
READ_LIMIT=50
compose() { docker-compose -f packaging/docker/docker-compose.yml "$@"; }
container() { "$DOCKER" ps -q --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME" \
    --filter "label=com.docker.compose.service=$1"; }

up() {
    local p
    for p in $ROOT_A_PORT $ROOT_B_PORT $NGINX_A_PORT $APP_A_PORT $NGINX_B_PORT $APP_B_PORT; do
        if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "cluster: port $p on 127.0.0.1 is in use (a cluster already up? cluster.sh down)" >&2
            exit 1
        fi
    done
    engine_up
    if [ "${YARL_CLUSTER_BUILD:-yes}" != no ]; then
        packaging/docker/images.sh all
    fi
    echo "cluster: starting $COMPOSE_PROJECT_NAME (PostgreSQL, root A, root B, app A, app B, nginx A, nginx B)"
    # up -d returns once every service has started after its dependencies were healthy.
    if ! compose up -d --no-build 2>&1 | sed 's/^/  /' || ! wait_healthy nginx-a nginx-b; then
        logs
        echo "cluster: not up; \`$0 down\` removes what started" >&2
        exit 1
    fi

    local admin
    admin=$("$DOCKER" exec "$(container root-a)" cat /var/lib/yarl/admin.token)
    put() {
        curl -fsS --max-time 5 -X PUT -H "Authorization: Bearer $admin" \
            "http://127.0.0.1:$ROOT_A_PORT/v1/quotas/$1" -d "$2"
        echo
    }
    echo "cluster: the example quotas, through root A (both roots read them from PostgreSQL)"
    # The recommended bursts (README): 1.5 and 3 times the limit for a 1 s sync interval.
    put s3_photos '{"limit":100,"low_burst":150,"high_burst":300,"parent":null}'
    put s3_photos_read "{\"limit\":$READ_LIMIT,\"low_burst\":$((READ_LIMIT * 3 / 2)),\"high_burst\":$((READ_LIMIT * 3)),\"parent\":\"s3_photos\"}"
    # What the applications account (nginx only checks): one unit per GET, to the handler
    # quota and through it to s3_photos_read.
    put s3_photos_get '{"limit":1000,"low_burst":1000,"high_burst":2000,"parent":"s3_photos_read"}'
    # Each application keeps its objects in its own memory: the bucket and the object the
    # traffic reads, in both, through their nginx (writes have no quota here).
    local n
    for n in "$NGINX_A" "$NGINX_B"; do
        curl -fsS --max-time 5 -o /dev/null -X PUT -H 'Host: s3.example.net' "http://127.0.0.1:$n/photos"
        curl -fsS --max-time 5 -o /dev/null -X PUT -H 'Host: s3.example.net' --data-binary 'a cat' \
            "http://127.0.0.1:$n/photos/cat.jpg"
    done
    echo "cluster: bucket photos with cat.jpg in both applications"
    cat <<TXT

The cluster $COMPOSE_PROJECT_NAME runs (docker-compose -p $COMPOSE_PROJECT_NAME -f packaging/docker/docker-compose.yml ps):
  PostgreSQL  no network: its socket is in the volume ${COMPOSE_PROJECT_NAME}_pg-socket
  root A      http://127.0.0.1:$ROOT_A_PORT    root B  http://127.0.0.1:$ROOT_B_PORT
              quotas in PostgreSQL; the admin token in the volume ${COMPOSE_PROJECT_NAME}_yarl,
              the sync token in ${COMPOSE_PROJECT_NAME}_yarl-sync (all that nginx and the apps mount)
  nginx A     http://127.0.0.1:$NGINX_A  the S3 example's balancer (yarl_check, counts nothing)
              in front of app A http://127.0.0.1:$APP_A_PORT (yarl-s3-app: accounts s3_photos_get)
  nginx B     http://127.0.0.1:$NGINX_B  in front of app B http://127.0.0.1:$APP_B_PORT
  All four sync with both roots every second.

Reads of the bucket "photos" may use $READ_LIMIT requests/s across the whole cluster (quota
s3_photos_read). Send traffic to both nginx at once and watch the two share it: admitted per
second, nginx A + nginx B ~ $READ_LIMIT, whatever each one gets:
  packaging/docker/cluster.sh traffic 60 20      # 60 req/s to each nginx for 20 s
or by hand, in two terminals (Ctrl-C stops):
  while true; do curl -s -o /dev/null -w '%{http_code}\\n' http://127.0.0.1:$NGINX_A/photos/cat.jpg; done | uniq -c
  while true; do curl -s -o /dev/null -w '%{http_code}\\n' http://127.0.0.1:$NGINX_B/photos/cat.jpg; done | uniq -c
Watch:
  ADMIN=\$(docker exec $(name root-a) cat /var/lib/yarl/admin.token)
  curl -s -H "Authorization: Bearer \$ADMIN" 127.0.0.1:$ROOT_A_PORT/v1/quotas/s3_photos_read   # cluster-wide fill, rate, drop probability
  curl -s 127.0.0.1:$NGINX_A/yarl/stats                        # nginx A's limiter (one, shared by its workers)
  curl -s 127.0.0.1:$ROOT_B_PORT/metrics | grep -E 'yarl_root_(limiters|sync_requests)'
  docker logs -f $(name nginx-a)                  # \$yarl_status of each request, rejections
  packaging/docker/cluster.sh status
Change the quota (both nginx follow within ~2 s, no reload):
  curl -s -X PUT -H "Authorization: Bearer \$ADMIN" 127.0.0.1:$ROOT_B_PORT/v1/quotas/s3_photos_read -d '{"limit":20,"low_burst":30,"high_burst":60,"parent":"s3_photos"}'
Stop and remove it all: make docker-cluster-down (or packaging/docker/cluster.sh down)
TXT
}

# The container name docker-compose gives a service.
name() { "$DOCKER" inspect -f '{{.Name}}' "$(container "$1")" 2>/dev/null | sed 's|^/||'; }

wait_healthy() {
    local s i state
    for s in "$@"; do
        for i in $(seq 1 60); do
            state=$("$DOCKER" inspect -f '{{.State.Health.Status}}' "$(container "$s")" 2>/dev/null || echo gone)
            [ "$state" = healthy ] && break
            if [ "$state" = gone ] || [ "$i" = 60 ]; then
                echo "cluster: $s is not healthy ($state)" >&2
                return 1
            fi
            sleep 1
        done
    done
}

logs() {
    echo "cluster: the end of each container's log:" >&2
    compose logs --no-color --tail 15 >&2 || true
}

traffic() {
    local rate=${1:-60} seconds=${2:-20} dir limit
    dir=$(mktemp -d /tmp/yarl-cluster-traffic.XXXXXX)
    # The quota as it is now (it may have been changed since `up`).
    limit=$(curl -fs --max-time 5 -H "Authorization: Bearer $("$DOCKER" exec "$(container root-a)" cat /var/lib/yarl/admin.token)" \
        "http://127.0.0.1:$ROOT_A_PORT/v1/quotas/s3_photos_read" | sed -n 's/.*"limit":\([0-9.]*\).*/\1/p')
    limit=${limit:-?}
    echo "cluster: $rate req/s to each nginx (GET /photos/cat.jpg: quota s3_photos_read, $limit/s) for $seconds s"
    python3 scripts/loadgen.py "http://127.0.0.1:$NGINX_A/photos/cat.jpg" "$rate" "$seconds" 4 >"$dir/a" &
    python3 scripts/loadgen.py "http://127.0.0.1:$NGINX_B/photos/cat.jpg" "$rate" "$seconds" 4 >"$dir/b" &
    wait
    # loadgen.py's table: second admitted rejected other.
    awk -v limit="$limit" '
        FNR == 1 { f++ }
        $1 ~ /^[0-9]+$/ && NF == 4 { adm[f, $1] = $2; rej[f, $1] = $3; oth[f, $1] = $4; if ($1 > n) n = $1 }
        END {
            printf "second  nginx A  nginx B  both admitted  both rejected  other\n"
            for (s = 0; s <= n; s++) {
                both = adm[1, s] + adm[2, s]
                printf "%6d  %7d  %7d  %13d  %13d  %5d\n", s, adm[1, s], adm[2, s], both, rej[1, s] + rej[2, s], oth[1, s] + oth[2, s]
                if (s >= 5) { sum += both; sa += adm[1, s]; sb += adm[2, s]; k++ }
            }
            if (k) printf "admitted per second from 5 s: both %.1f (nginx A %.1f, nginx B %.1f); quota %s/s\n", sum / k, sa / k, sb / k, limit
        }' "$dir/a" "$dir/b"
    rm -rf "$dir"
}

status() {
    compose ps
    local port
    for port in $ROOT_A_PORT $ROOT_B_PORT; do
        echo "root 127.0.0.1:$port: $(curl -fs --max-time 5 "http://127.0.0.1:$port/metrics" \
            | grep -E '^yarl_root_(limiters|sync_requests_total)' | tr '\n' ' ')"
    done
}

down() {
    if engine_answers; then
        compose down -v --remove-orphans 2>&1 | sed 's/^/  /'
    fi
    engine_down_recorded
}

case "${1:-}" in
up) up ;;
traffic) shift; traffic "$@" ;;
status) status ;;
down) down ;;
*) echo "usage: $0 up | traffic [RATE [SECONDS]] | status | down" >&2; exit 2 ;;
esac
