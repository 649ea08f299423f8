#!/usr/bin/env python3
"""A paced load step on loopback: BEFORE requests/s for STEP_AT seconds, then AFTER
requests/s until SECONDS, spread over CONNS keep-alive connections that take the URLs in
turn (connection k talks to URLs[k % len(URLs)]). Prints what was admitted (2xx) and
rejected (429) per 100 ms from a second before the step to 3 s after it, and the admitted
total over the first 2 s after the step against the limit.

usage: step-load.py URL[,URL...] BEFORE AFTER STEP_AT SECONDS LIMIT [CONNS]
"""
import http.client
import sys
import threading
import time
import urllib.parse

BIN = 0.1


def main():
    urls = [urllib.parse.urlsplit(u) for u in sys.argv[1].split(",")]
    before, after = float(sys.argv[2]), float(sys.argv[3])
    step_at, seconds, limit = float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
    conns = int(sys.argv[7]) if len(sys.argv) > 7 else 16
    for u in urls:
        if u.hostname not in ("127.0.0.1", "localhost", "::1"):
            sys.exit("step-load: loopback targets only")
    bins = int(seconds / BIN) + 1
    ok, rejected, other = [0] * bins, [0] * bins, [0] * bins
    late = [0]
    lock = threading.Lock()
    start = time.monotonic() + 0.2

    def schedule(k):
        # Request times of connection k: its share of each phase's rate, phase-shifted.
        t, i = 0.0, 0
        while True:
            rate = before if t < step_at else after
            t += conns / rate
            if t >= seconds:
                return
            yield t + (k / conns) * (conns / rate)
            i += 1

    def worker(k):
        u = urls[k % len(urls)]
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
        for at in schedule(k):
            delay = start + at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            elif delay < -0.05:
                with lock:
                    late[0] += 1
            try:
                c.request("GET", u.path or "/")
                r = c.getresponse()
                r.read()
                code = r.status
            except (OSError, http.client.HTTPException):
                c.close()
                c = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
                code = 0
            b = min(int(at / BIN), bins - 1)
            with lock:
                if 200 <= code < 300:
                    ok[b] += 1
                elif code == 429:
                    rejected[b] += 1
                else:
                    other[b] += 1
        c.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = int(round(step_at / BIN))
    print("   t (s)  offered admitted rejected other  admitted since step / limit")
    since = 0
    for b in range(max(0, first - 10), min(bins, first + 30)):
        if b >= first:
            since += ok[b]
        offered = ok[b] + rejected[b] + other[b]
        t = (b - first) * BIN
        print(f"{t:+8.1f} {offered:8d} {ok[b]:8d} {rejected[b]:8d} {other[b]:5d}"
              f"  {since / limit:8.2f}")
    two = sum(ok[first:first + int(round(2 / BIN))])
    print(f"admitted in the 2 s after the step: {two} = {two / (2 * limit):.2f} x (2 s x limit)")
    errors = sum(other)
    print(f"non-2xx/429 answers: {errors}; requests sent more than 50 ms late: {late[0]}")


if __name__ == "__main__":
    main()
