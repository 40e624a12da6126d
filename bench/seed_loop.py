#!/usr/bin/env python3
"""The "seed-style" Redis leader loop people write by hand, as a benchmark peer.

Every candidate polls `SET key token NX PX ttl` every 10 ms. The one whose SET
succeeds leads and renews every TTL/3 with a Lua check-then-PEXPIRE (a renewal
that finds another token means the term is over). SIGTERM releases the key with
a Lua check-then-DEL and exits 0; SIGKILL leaves the key to expire.

Output, one line each, flushed at once (benches/compare.rs reads it):
  READY                 connected, campaigning
  LEADER <unix-ns>      this candidate acquired the key
  FOLLOWER <unix-ns>    a renewal found the key gone or taken
"""
import argparse
import os
import signal
import sys
import time

import redis

# Renew only our own key: PEXPIRE it if it still holds our token.
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
# Release only our own key: DEL it if it still holds our token.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class Terminated(Exception):
    """Raised by the SIGTERM handler; interrupts the sleep between polls."""


def on_sigterm(_signum, _frame):
    raise Terminated()


def say(word):
    print(f"{word} {time.time_ns()}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--ttl-ms", type=int, default=5000)
    p.add_argument("--poll-ms", type=int, default=10)
    args = p.parse_args()

    token = os.urandom(16).hex()
    renew_every = args.ttl_ms / 3 / 1000.0
    r = redis.Redis.from_url(args.url)
    r.ping()
    leading = False
    signal.signal(signal.SIGTERM, on_sigterm)
    print("READY", flush=True)
    try:
        while True:
            if not leading:
                # Campaign: one SET NX PX per poll period.
                if r.set(args.key, token, nx=True, px=args.ttl_ms):
                    leading = True
                    say("LEADER")
                    next_renew = time.monotonic() + renew_every
                else:
                    time.sleep(args.poll_ms / 1000.0)
            else:
                time.sleep(max(0.0, next_renew - time.monotonic()))
                next_renew += renew_every
                if not r.eval(RENEW, 1, args.key, token, args.ttl_ms):
                    leading = False
                    say("FOLLOWER")
    except Terminated:
        if leading:
            # A fresh connection: the signal may have interrupted a command.
            redis.Redis.from_url(args.url).eval(RELEASE, 1, args.key, token)
        sys.exit(0)


if __name__ == "__main__":
    main()
