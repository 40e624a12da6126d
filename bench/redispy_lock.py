#!/usr/bin/env python3
"""redis-py's `Lock` used as a leader election, as a benchmark peer.

Each candidate blocks in `Lock.acquire()` (redis-py polls `SET NX PX` every
`sleep` = 0.1 s); the holder extends the lock to the full TTL every TTL/3
(`extend(..., replace_ttl=True)`, redis-py's Lua check-then-PEXPIRE). SIGTERM
releases the lock (`release()`, Lua check-then-DEL) and exits 0; SIGKILL leaves
the key to expire.

Output, one line each, flushed at once (benches/compare.rs reads it):
  READY                 connected, campaigning
  LEADER <unix-ns>      this candidate acquired the lock
  FOLLOWER <unix-ns>    an extension found the lock gone or taken
"""
import argparse
import signal
import sys
import time

import redis
from redis.exceptions import LockError


class Terminated(Exception):
    """Raised by the SIGTERM handler; interrupts the sleeps."""


def on_sigterm(_signum, _frame):
    raise Terminated()


def say(word):
    print(f"{word} {time.time_ns()}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--ttl-ms", type=int, default=5000)
    p.add_argument("--sleep", type=float, default=0.1)
    args = p.parse_args()

    ttl = args.ttl_ms / 1000.0
    r = redis.Redis.from_url(args.url)
    r.ping()
    lock = r.lock(args.key, timeout=ttl, sleep=args.sleep, blocking=True)
    leading = False
    signal.signal(signal.SIGTERM, on_sigterm)
    print("READY", flush=True)
    try:
        while True:
            lock.acquire()  # blocks, polling every `sleep` seconds
            leading = True
            say("LEADER")
            while True:
                time.sleep(ttl / 3)
                try:
                    lock.extend(ttl, replace_ttl=True)
                except LockError:
                    leading = False
                    say("FOLLOWER")
                    break
    except Terminated:
        if leading:
            try:
                lock.release()
            except LockError:
                pass
        sys.exit(0)


if __name__ == "__main__":
    main()
