"""The coordination benchmark's peer: redis-py's Lock, acquire + release in a
loop directly against Redis, one client and then 20 threads on one lock.

Usage: redispy_lock_loop.py REDIS_URL ROUNDS
Prints one markdown row tail: "p50 | p99 | rounds/s | contended acquisitions/s".
"""
import sys
import threading
import time

import redis


def main():
    url, rounds = sys.argv[1], int(sys.argv[2])
    r = redis.Redis.from_url(url)
    lat = []
    t0 = time.perf_counter()
    for _ in range(rounds):
        t = time.perf_counter()
        lock = r.lock("pybench", timeout=10, blocking=True)
        lock.acquire()
        lock.release()
        lat.append((time.perf_counter() - t) * 1000)
    rate = rounds / (time.perf_counter() - t0)
    lat.sort()
    p50 = lat[len(lat) // 2]
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]

    each = 25

    def worker():
        c = redis.Redis.from_url(url)
        for _ in range(each):
            lock = c.lock("pyhot", timeout=10, blocking=True, sleep=0.01)
            lock.acquire()
            lock.release()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    hot = 20 * each / (time.perf_counter() - t0)
    print(f"{p50:.2f} ms | {p99:.2f} ms | {rate:.0f} | {hot:.0f}")


if __name__ == "__main__":
    main()
