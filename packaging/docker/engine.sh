# shellcheck shell=bash
# Sourced by the scripts beside it: a Docker engine for them, started only when none answers.
#
#   engine_up            if no engine answers, starts Debian's dockerd (overlay2; the MTU of
#                        the host's default route, which may be below Docker's 1500) and
#                        waits until it answers; records its pid in this shell
#                        (ENGINE_STARTED_PID) and, when ENGINE_PIDFILE is set, in that file
#   engine_down          stops the dockerd this shell started, if any (that pid only)
#   engine_down_recorded stops the dockerd recorded in $ENGINE_PIDFILE (by an earlier
#                        `cluster.sh up`), if it still runs
#
# DOCKER (default docker) is the client. dockerd's log: $ENGINE_DIR/dockerd.log.

DOCKER=${DOCKER:-docker}
ENGINE_DIR=${ENGINE_DIR:-$PWD/.run/docker}
ENGINE_PIDFILE=${ENGINE_PIDFILE:-}
ENGINE_STARTED_PID=""

engine_answers() { timeout 10 "$DOCKER" version >/dev/null 2>&1; }

engine_up() {
    mkdir -p "$ENGINE_DIR"
    if engine_answers; then
        return 0
    fi
    if ! command -v dockerd >/dev/null; then
        echo "engine: no Docker engine answers and dockerd is missing (make docker-deps)" >&2
        return 1
    fi
    if [ "$(id -u)" -ne 0 ]; then
        echo "engine: no Docker engine answers; starting dockerd needs root" >&2
        return 1
    fi
    local dev mtu=1500
    dev=$(ip route show default 2>/dev/null \
        | awk '{ for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit } }')
    if [ -n "$dev" ] && [ -r "/sys/class/net/$dev/mtu" ]; then
        mtu=$(cat "/sys/class/net/$dev/mtu")
    fi
    echo "engine: none answers; starting dockerd (overlay2, MTU $mtu, log $ENGINE_DIR/dockerd.log)"
    setsid dockerd --storage-driver=overlay2 --mtu "$mtu" \
        >"$ENGINE_DIR/dockerd.log" 2>&1 </dev/null &
    ENGINE_STARTED_PID=$!
    [ -z "$ENGINE_PIDFILE" ] || echo "$ENGINE_STARTED_PID" >"$ENGINE_PIDFILE"
    for _ in $(seq 1 60); do
        if engine_answers; then
            echo "engine: dockerd $ENGINE_STARTED_PID answers"
            return 0
        fi
        if ! kill -0 "$ENGINE_STARTED_PID" 2>/dev/null; then
            echo "engine: dockerd exited:" >&2
            tail -n 20 "$ENGINE_DIR/dockerd.log" >&2
            ENGINE_STARTED_PID=""
            [ -z "$ENGINE_PIDFILE" ] || rm -f "$ENGINE_PIDFILE"
            return 1
        fi
        sleep 0.5
    done
    echo "engine: dockerd did not answer within 30 s:" >&2
    tail -n 20 "$ENGINE_DIR/dockerd.log" >&2
    engine_down
    return 1
}

# engine_stop PID: stops that dockerd (SIGTERM, then SIGKILL after 30 s).
engine_stop() {
    local pid=$1
    # Still the dockerd we started (a pid can be reused)?
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] || return 0
    echo "engine: stopping dockerd $pid (started for this)"
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 60); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.5
    done
    echo "engine: dockerd $pid still running after 30 s; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
}

engine_down() {
    [ -n "$ENGINE_STARTED_PID" ] || return 0
    engine_stop "$ENGINE_STARTED_PID"
    [ -z "$ENGINE_PIDFILE" ] || rm -f "$ENGINE_PIDFILE"
    ENGINE_STARTED_PID=""
}

engine_down_recorded() {
    [ -n "$ENGINE_PIDFILE" ] && [ -f "$ENGINE_PIDFILE" ] || return 0
    engine_stop "$(cat "$ENGINE_PIDFILE")"
    rm -f "$ENGINE_PIDFILE"
}
