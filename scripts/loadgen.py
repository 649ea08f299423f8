#!/usr/bin/env python3
"""Paced HTTP load on loopback: RATE requests/s for SECONDS, over CONNS keep-alive
connections, then prints how many were admitted (2xx) and rejected (429) in each second.

usage: loadgen.py URL RATE SECONDS [CONNS]
"""
import http.client
import statistics
import sys
import threading
import time
import urllib.parse


def main():
    url, rate, seconds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    conns = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    u = urllib.parse.urlsplit(url)
    if u.hostname not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("loadgen: loopback targets only")
    ok = [0] * seconds
    rejected = [0] * seconds
    other = [0] * seconds
    lock = threading.Lock()
    start = time.monotonic() + 0.2

    def worker(k):
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
        per = rate / conns
        i = 0
        while True:
            at = start + (i + k / conns) / per
            sec = int(at - start)
            if sec >= seconds:
                break
            delay = at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                c.request("GET", u.path or "/")
                r = c.getresponse()
                r.read()
                code = r.status
            except (OSError, http.client.HTTPException):
                c.close()
                c = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
                code = 0
            with lock:
                if 200 <= code < 300:
                    ok[sec] += 1
                elif code == 429:
                    rejected[sec] += 1
                else:
                    other[sec] += 1
            i += 1
        c.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("second admitted rejected other")
    for s in range(seconds):
        print(f"{s:6d} {ok[s]:8d} {rejected[s]:8d} {other[s]:5d}")
    for label, part in (("all", ok), ("from 5 s", ok[5:])):
        mean = statistics.mean(part)
        sd = statistics.pstdev(part)
        print(f"admitted per second ({label}): mean {mean:.1f}, stddev {sd:.1f}, "
              f"min {min(part)}, max {max(part)}, CV {sd / mean:.3f}")
    print(f"offered {sum(ok) + sum(rejected) + sum(other)} requests, "
          f"admitted {sum(ok)}, rejected {sum(rejected)}, other {sum(other)}")


if __name__ == "__main__":
    main()
