#!/usr/bin/env python3
"""A cluster-wide cap on requests in flight, measured on real processes: two nginx of two
workers each (`yarl_concurrency conc;`), two roots (`--replica 0/2` and `1/2`, one
PostgreSQL), quota `conc` with `max_in_flight` C (50), requests proxied to a slow upstream
(200 ms each) which counts what it runs every 10 ms, with the most it ran in between.
Everything on loopback.

    scripts/with-postgres.sh scripts/measure-concurrency.py --nginx NGINX --module MODULE.so \\
        --root YARL_ROOT

The load is closed-loop clients (4 x C by default), each on a keep-alive connection to one
nginx, sending the next request when the last one ends (after 100 ms when it was refused,
so refusals do not spin). Phases:

1. steady: half the clients on each nginx for --steady seconds (60): the upstream's count,
   its maximum (the cap: never above C) and mean (utilisation, target >= 0.9 C);
2. move: every client on nginx 1 for 15 s, then every client on nginx 2: the time from the
   move until nginx 2 runs >= 0.9 C at the upstream (target: 2 sync intervals);
3. kill: three quarters of the clients on nginx 1 (which then holds most of C), the rest on
   nginx 2; nginx 1 is killed with -9 (master and workers) and its clients move to nginx 2:
   the time until nginx 2 runs C (target: the lease + 1 interval);
4. leak: the load stops; the roots' `yarl_root_in_flight` must fall to 0 and C + 10
   requests at once on nginx 2 must see exactly C admitted.

Prints the figures and a MISSED line per target missed; exits 1 when the cap was exceeded
or a slot leaked (what must never happen), 0 otherwise.

With --keys K, the cap is per key instead: template `gen_*` with `max_in_flight` C (5 by
default then), `yarl_concurrency gen_$arg_k;`, K keys each offered 4 x C by clients split
over both nginx, for --steady seconds: each key's most in flight at the upstream (never
above C once warm) and its mean (utilisation); then one new key every second for 10 s,
each with 4 x C clients from the start: whether its first requests ran at once, and its
most in flight in its first second (at most 2 C by design: a key new to a host starts on
the template's own slots until the roots answer for it).
"""

import argparse
import asyncio
import http.client
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT_PORTS = (17761, 17762)
NGINX_PORTS = (18761, 18762)
UPSTREAM_PORT = 18769
HOLD = 0.2
INTERVAL = 1.0
LEASE = 3.0


# The upstream: a separate process, so the load's event loop does not delay its counting.
def upstream(port, out):
    counts = {"total": 0, b"a": 0, b"b": 0}
    keys = {}
    # The most in flight since the last sample, overall and per key: a request that came
    # and went between two samples still counts toward the maximum.
    peaks = {"total": 0}
    f = open(out, "w", buffering=1)

    async def serve(reader, writer):
        who, key = b"?", None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            m = re.search(rb"(?im)^x-from:\s*(\w+)", head)
            who = m.group(1) if m else b"?"
            m = re.search(rb"(?im)^x-key:\s*(\w+)", head)
            key = m.group(1).decode() if m else None
            counts["total"] += 1
            counts[who] = counts.get(who, 0) + 1
            peaks["total"] = max(peaks["total"], counts["total"])
            if key:
                keys[key] = keys.get(key, 0) + 1
                peaks[key] = max(peaks.get(key, 0), keys[key])
            try:
                await asyncio.sleep(HOLD)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")
                await writer.drain()
            finally:
                counts["total"] -= 1
                counts[who] -= 1
                if key:
                    keys[key] -= 1
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def sample():
        while True:
            per_key = " ".join(f"{k}={v}:{peaks.get(k, v)}" for k, v in keys.items()
                               if v or peaks.get(k))
            f.write(f"{time.time():.4f} {counts['total']} {counts[b'a']} {counts[b'b']} "
                    f"peak={peaks['total']} {per_key}\n")
            peaks.clear()
            peaks.update(keys)
            peaks["total"] = counts["total"]
            await asyncio.sleep(0.01)

    async def main():
        server = await asyncio.start_server(serve, "127.0.0.1", port, backlog=1024)
        asyncio.ensure_future(sample())
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def call(method, port, path, body=None, timeout=3.0):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        c.close()


def wait_for(cond, timeout, what):
    end = time.time() + timeout
    while time.time() < end:
        try:
            if cond():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


class Cluster:
    def __init__(self, a, d):
        self.a, self.dir = a, d
        self.procs = []
        self.nginx_pids = [None, None]

    def start_roots(self):
        for r, port in enumerate(ROOT_PORTS):
            log = open(f"{self.dir}/root{r}.log", "w")
            self.procs.append(subprocess.Popen(
                [self.a.root, "--listen", f"127.0.0.1:{port}", "--db", os.environ["YARL_TEST_PG_URL"],
                 "--poll-interval", "200ms", "--replica", f"{r}/2",
                 "--in-flight-lease", f"{int(LEASE * 1000)}ms"], stdout=log, stderr=log))
        for port in ROOT_PORTS:
            wait_for(lambda p=port: call("GET", p, "/healthz")[0] == 200, 20, "the roots")

    def start_upstream(self):
        self.samples = f"{self.dir}/samples.txt"
        self.procs.append(subprocess.Popen(
            [sys.executable, __file__, "--upstream", str(UPSTREAM_PORT), self.samples]))
        wait_for(lambda: os.path.getsize(self.samples) > 0, 10, "the upstream")

    def start_nginx(self, i):
        d = f"{self.dir}/n{i}"
        os.makedirs(f"{d}/logs", exist_ok=True)
        roots = " ".join(f"http://127.0.0.1:{p}" for p in ROOT_PORTS)
        user = "user root;" if os.geteuid() == 0 else ""
        with open(f"{d}/nginx.conf", "w") as f:
            f.write(f"""load_module {self.a.module};
{user}
worker_processes 2;
error_log {d}/logs/error.log notice;
pid {d}/logs/nginx.pid;
events {{ worker_connections 2048; }}
http {{
    access_log off;
    client_body_temp_path {d}/logs;
    proxy_temp_path {d}/logs;
    yarl_roots {roots};
    yarl_sync_interval {int(INTERVAL * 1000)}ms;
    server {{
        listen 127.0.0.1:{NGINX_PORTS[i]} reuseport;
        location /c/ {{
            yarl_concurrency conc;
            proxy_pass http://127.0.0.1:{UPSTREAM_PORT}/;
            proxy_set_header X-From {"ab"[i]};
        }}
        location /k/ {{
            yarl_concurrency gen_$arg_k;
            proxy_pass http://127.0.0.1:{UPSTREAM_PORT}/;
            proxy_set_header X-From {"ab"[i]};
            proxy_set_header X-Key $arg_k;
        }}
        location = /stats {{ yarl_stats; }}
    }}
}}
""")
        subprocess.run([self.a.nginx, "-p", f"{d}/", "-c", f"{d}/nginx.conf"], check=True)
        wait_for(lambda: os.path.exists(f"{d}/logs/nginx.pid"), 10, f"nginx {i + 1}'s pid")
        with open(f"{d}/logs/nginx.pid") as f:
            self.nginx_pids[i] = int(f.read())
        wait_for(lambda: call("GET", NGINX_PORTS[i], "/stats")[0] == 200, 20, f"nginx {i + 1}")

    def kill_nginx(self, i):
        master = self.nginx_pids[i]
        pids = [master] + children(master)
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.nginx_pids[i] = None

    def stop(self):
        for i, p in enumerate(self.nginx_pids):
            if p:
                try:
                    os.kill(p, signal.SIGQUIT)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()

    def root_in_flight(self):
        total = 0.0
        for port in ROOT_PORTS:
            s, body = call("GET", port, "/metrics")
            for m in re.finditer(r'(?m)^yarl_root_in_flight\{quota="conc"\} (\S+)$', body):
                total += float(m.group(1))
        return total


def children(pid):
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(p))
            except (OSError, IndexError, ValueError):
                pass
    return out


class Load:
    """Closed-loop clients; `assign[k]` is the nginx client k uses (None: idle); `paths[k]`
    what it asks for."""

    def __init__(self, n, paths=None):
        self.assign = [None] * n
        self.paths = paths or [b"/c/"] * n
        self.stop = False
        self.counts = {"ok": 0, "refused": 0, "failed": 0, "errors": 0}

    async def client(self, k):
        while not self.stop:
            target = self.assign[k]
            if target is None:
                await asyncio.sleep(0.05)
                continue
            writer = None
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", NGINX_PORTS[target]), 2)
                while not self.stop and self.assign[k] == target:
                    path = self.paths[k]
                    writer.write(b"GET " + path + b" HTTP/1.1\r\nHost: load\r\n\r\n")
                    status = await asyncio.wait_for(read_response(reader), 5)
                    if status == 200:
                        self.counts["ok"] += 1
                    elif status == 429:
                        self.counts["refused"] += 1
                        await asyncio.sleep(0.1)
                    else:
                        # Not a refusal: a failure (a 5xx of nginx or the upstream) must
                        # not pass for the cap at work.
                        self.counts["failed"] += 1
                        await asyncio.sleep(0.1)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
                self.counts["errors"] += 1
                await asyncio.sleep(0.05)
            finally:
                if writer:
                    writer.close()

    def run_in_thread(self):
        def main():
            async def all_clients():
                await asyncio.gather(*(self.client(k) for k in range(len(self.assign))))
            asyncio.run(all_clients())
        t = threading.Thread(target=main, daemon=True)
        t.start()
        return t

    def set(self, on_first, on_second):
        n = len(self.assign)
        for k in range(n):
            self.assign[k] = 0 if k < on_first else 1 if k < on_first + on_second else None


async def read_response(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    if not m:
        raise ValueError("no Content-Length")
    await reader.readexactly(int(m.group(1)))
    return status


def watch_shares(path):
    """Every 100 ms, each nginx's share and in flight (yarl_stats), for diagnosis."""
    import json
    with open(path, "w", buffering=1) as f:
        while True:
            row = [f"{time.time():.3f}"]
            for port in NGINX_PORTS:
                try:
                    q = json.loads(call("GET", port, "/stats", timeout=1)[1])["concurrency"]["quotas"][0]
                    row.append(f"{q['share']} {q['in_flight']} {q['refused']}")
                except (OSError, ValueError, KeyError, IndexError):
                    row.append("- - -")
            f.write(" ".join(row) + "\n")
            time.sleep(0.1)


def read_samples(path, t0, t1, keys=False):
    """(time, total, from nginx 1, from nginx 2, the most in flight since the sample before),
    with dicts of the keys' most since the sample before and of their counts at the sample
    between the last two when `keys`."""
    out = []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) >= 5 and t0 <= float(p[0]) < t1:
                row = (float(p[0]), int(p[1]), int(p[2]), int(p[3]))
                if keys:
                    kv = [(k, v.split(":")) for k, v in (t.split("=") for t in p[5:])]
                    row += (dict((k, int(v[1])) for k, v in kv), dict((k, int(v[0])) for k, v in kv))
                out.append(row + (int(p[4].split("=")[1]),))
    return out


def measure_keys(c, a):
    """Per-key caps under a template (see the module's documentation). True if fatal."""
    cap, k = a.cap, a.keys
    s, b = call("PUT", ROOT_PORTS[0], "/v1/quotas/gen_%2A", f'{{"max_in_flight": {cap}}}')
    if s != 200:
        raise RuntimeError(f"PUT gen_*: {s} {b}")
    per = 4 * cap
    new_keys = 10
    paths = [f"/k/?k=k{i // per}".encode() for i in range((k + new_keys) * per)]
    load = Load(len(paths), paths)
    load.run_in_thread()
    print(f"per key: template gen_* with max_in_flight {cap}, {k} keys of {per} clients each "
          f"(half on each nginx), requests of {HOLD * 1000:.0f} ms, 2 nginx x 2 workers, 2 roots")
    for i in range(k * per):
        load.assign[i] = i % 2
    time.sleep(5)
    t0 = time.time()
    time.sleep(a.steady)
    st = read_samples(c.samples, t0, time.time(), keys=True)
    fatal = False
    most = {f"k{j}": 0 for j in range(k)}
    total = {f"k{j}": 0 for j in range(k)}
    for row in st:
        for key in most:
            most[key] = max(most[key], row[4].get(key, 0))
            total[key] += row[5].get(key, 0)
    means = [total[key] / len(st) for key in most]
    mx = max(most.values())
    print(f"steady {a.steady:.0f} s, {len(st)} samples: most in flight of any key {mx} (cap "
          f"{cap}); mean per key {min(means):.2f} to {max(means):.2f} = "
          f"{min(means) / cap:.3f} to {max(means) / cap:.3f} x C")
    if mx > cap:
        print(f"MISSED: a key above its cap ({mx} > {cap})")
        fatal = True
    if min(means) < 0.9 * cap:
        print(f"MISSED: per-key utilisation {min(means) / cap:.3f} < 0.9")
    # New keys, one a second, each with all its clients at once.
    starts = {}
    for j in range(k, k + new_keys):
        starts[f"k{j}"] = time.time()
        for i in range(j * per, (j + 1) * per):
            load.assign[i] = i % 2
        time.sleep(1.0)
    time.sleep(1.0)
    nk = read_samples(c.samples, min(starts.values()), time.time(), keys=True)
    first_most, late_most, runs = 0, 0, []
    for key, t in starts.items():
        ran = first_at(nk, t, lambda r, key=key: r[4].get(key, 0) > 0)
        runs.append(ran if ran is not None else float("inf"))
        first_most = max([first_most] + [r[4].get(key, 0) for r in nk if t <= r[0] < t + 1.0])
        late_most = max([late_most] + [r[4].get(key, 0) for r in nk if r[0] >= t + 1.0])
    runs.sort()
    print(f"{new_keys} new keys, one a second: the upstream ran a new key's first request "
          f"{runs[len(runs) // 2] * 1000:.0f} ms after its clients started (median; slowest "
          f"{runs[-1] * 1000:.0f} ms); most in flight of a new key in its first second "
          f"{first_most} (bound 2 x C = {2 * cap}), after it {late_most} (cap {cap})")
    if first_most > 2 * cap or late_most > cap:
        print("MISSED: a new key above its bound")
        fatal = True
    print(f"load: {load.counts['ok']} admitted, {load.counts['refused']} refused (429), "
          f"{load.counts['failed']} failed (another status), "
          f"{load.counts['errors']} connection errors")
    load.stop = True
    return fatal


def first_at(samples, t0, pred):
    for s in samples:
        if s[0] >= t0 and pred(s):
            return s[0] - t0
    return None


async def at_once(port, n):
    async def one():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /c/ HTTP/1.1\r\nHost: load\r\nConnection: close\r\n\r\n")
            status = await asyncio.wait_for(read_response(reader), 5)
            writer.close()
            return status
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
            return None
    return await asyncio.gather(*(one() for _ in range(n)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--upstream", nargs=2, metavar=("PORT", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--nginx")
    p.add_argument("--module")
    p.add_argument("--root")
    p.add_argument("--cap", type=int, default=50)
    p.add_argument("--clients", type=int, default=0, help="4 x cap when 0")
    p.add_argument("--steady", type=float, default=60.0)
    p.add_argument("--keys", type=int, default=0, help="per-key caps with this many keys")
    p.add_argument("--keep", action="store_true")
    a = p.parse_args()
    if a.upstream:
        upstream(int(a.upstream[0]), a.upstream[1])
        return
    if not (a.nginx and a.module and a.root):
        sys.exit("measure-concurrency: --nginx, --module and --root are needed")
    if "YARL_TEST_PG_URL" not in os.environ:
        sys.exit("measure-concurrency: run me through scripts/with-postgres.sh")
    a.module = os.path.abspath(a.module)
    if a.keys and a.cap == 50:
        a.cap = 5
    cap = a.cap
    n = a.clients or 4 * cap
    d = tempfile.mkdtemp(prefix="yarl-conc-")
    os.chmod(d, 0o755)
    c = Cluster(a, d)
    fatal = False
    try:
        c.start_roots()
        if a.keys:
            c.start_upstream()
            c.start_nginx(0)
            c.start_nginx(1)
            fatal = measure_keys(c, a)
            sys.exit(1 if fatal else 0)
        s, b = call("PUT", ROOT_PORTS[0], "/v1/quotas/conc", f'{{"max_in_flight": {cap}}}')
        if s != 200:
            raise RuntimeError(f"PUT conc: {s} {b}")
        c.start_upstream()
        c.start_nginx(0)
        c.start_nginx(1)
        load = Load(n)
        load.run_in_thread()
        if os.environ.get("DEBUG"):
            threading.Thread(target=watch_shares, args=(f"{d}/shares.txt",), daemon=True).start()
        print(f"C = {cap}, {n} clients, requests of {HOLD * 1000:.0f} ms, sync interval "
              f"{INTERVAL:.0f} s, lease {LEASE:.0f} s, 2 nginx x 2 workers, 2 roots")

        # 1. Steady, half on each.
        load.set(n // 2, n - n // 2)
        time.sleep(5)
        t0 = time.time()
        time.sleep(a.steady)
        st = read_samples(c.samples, t0, time.time())
        tot = [s[1] for s in st]
        mx, mean = max(s[4] for s in st), sum(tot) / len(tot)
        print(f"steady {a.steady:.0f} s, {len(st)} samples: max {mx} (cap {cap}), mean "
              f"{mean:.1f} = {mean / cap:.3f} x C; per nginx mean "
              f"{sum(s[2] for s in st) / len(st):.1f} / {sum(s[3] for s in st) / len(st):.1f}")
        if mx > cap:
            print(f"MISSED: above the cap ({mx} > {cap})")
            fatal = True
        if mean < 0.9 * cap:
            print(f"MISSED: utilisation {mean / cap:.3f} < 0.9")

        # 2. Move.
        load.set(n, 0)
        time.sleep(15)
        t_move = time.time()
        load.set(0, n)
        time.sleep(10)
        mv = read_samples(c.samples, t_move - 15, time.time())
        before = [s for s in mv if s[0] < t_move]
        t90 = first_at(mv, t_move, lambda s: s[3] >= 0.9 * cap)
        print(f"move: nginx 1 alone ran {sum(s[2] for s in before[-500:]) / max(1, len(before[-500:])):.1f} "
              f"in its last 5 s; after the move nginx 2 ran >= 0.9 C after "
              f"{'never' if t90 is None else f'{t90:.2f} s'} (target {2 * INTERVAL:.0f} s); "
              f"max in flight {max(s[4] for s in mv)}")
        if t90 is None or t90 > 2 * INTERVAL:
            print("MISSED: the share did not follow the traffic within 2 intervals")
        if max(s[4] for s in mv) > cap:
            print("MISSED: above the cap during the move")
            fatal = True

        # 3. Kill the nginx holding most of C.
        load.set(3 * n // 4, n - 3 * n // 4)
        time.sleep(10)
        pre = read_samples(c.samples, time.time() - 3, time.time())
        t_kill = time.time()
        c.kill_nginx(0)
        load.set(0, n)
        time.sleep(LEASE + 4 * INTERVAL + 2)
        kl = read_samples(c.samples, t_kill, time.time())
        t_all = first_at(kl, t_kill, lambda s: s[3] >= cap)
        t_90 = first_at(kl, t_kill, lambda s: s[3] >= 0.9 * cap)
        print(f"kill -9 of nginx 1 (it ran {sum(s[2] for s in pre) / len(pre):.1f} of {cap} "
              f"before): nginx 2 ran 0.9 C after "
              f"{'never' if t_90 is None else f'{t_90:.2f} s'}, all of C after "
              f"{'never' if t_all is None else f'{t_all:.2f} s'} (target lease + 1 interval = "
              f"{LEASE + INTERVAL:.0f} s); max in flight {max(s[4] for s in kl)}")
        if t_all is None or t_all > LEASE + INTERVAL:
            print("MISSED: the dead nginx's share came back later than the lease + 1 interval")
        if max(s[4] for s in kl) > cap:
            print("MISSED: above the cap after the kill")
            fatal = True

        # 4. No leak.
        load.set(0, 0)
        load.stop = True
        t_stop = time.time()
        left = None
        end = t_stop + LEASE + 5 * INTERVAL
        while time.time() < end:
            left = c.root_in_flight()
            if left == 0:
                break
            time.sleep(0.1)
        print(f"stopped: the roots' yarl_root_in_flight at {left:.0f} after "
              f"{time.time() - t_stop:.1f} s")
        time.sleep(2 * INTERVAL)
        statuses = asyncio.run(at_once(NGINX_PORTS[1], cap + 10))
        admitted = sum(1 for s in statuses if s == 200)
        print(f"then {cap + 10} requests at once on nginx 2: {admitted} admitted, "
              f"{sum(1 for s in statuses if s == 429)} refused, "
              f"{sum(1 for s in statuses if s not in (200, 429))} failed")
        if os.environ.get("DEBUG"):
            for port in ROOT_PORTS:
                body = call("GET", port, "/metrics")[1]
                print("\n".join(l for l in body.splitlines() if "in_flight" in l and not l.startswith("#")))
            print(call("GET", NGINX_PORTS[1], "/stats")[1][:3000])
        if left != 0 or admitted != cap:
            print("MISSED: slots leaked (or too many admitted)")
            fatal = True
        print(f"load: {load.counts['ok']} admitted, {load.counts['refused']} refused (429), "
              f"{load.counts['failed']} failed (another status), "
              f"{load.counts['errors']} connection errors (the killed nginx's clients)")
    except Exception as e:  # noqa: BLE001 - report and clean up whatever failed
        print(f"measure-concurrency: {e}", file=sys.stderr)
        fatal = True
    finally:
        c.stop()
        if a.keep or fatal:
            print(f"measure-concurrency: files kept in {d}", file=sys.stderr)
        else:
            subprocess.run(["rm", "-rf", d])
    sys.exit(1 if fatal else 0)


if __name__ == "__main__":
    main()
