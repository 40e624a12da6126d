#!/usr/bin/env python3
"""A lock with fencing through a leader-elector sidecar (Python stdlib only).

Two workers take the lock `report` through the sidecar's control API and
write to a store that refuses a fencing token smaller than the largest it
has seen. Worker A takes the lock with a short TTL and stalls (a GC pause, a
stopped VM) without renewing; the lock expires and worker B gets it, with a
larger fencing token, and writes. When A wakes up its write is refused by
the store and its renewal answers 410: the lock alone could not have stopped
it, the fencing token does.

    python3 lock_with_fencing.py [--control http://127.0.0.1:4041]

Exit 0 when the story went as told, 1 otherwise.
"""
import argparse
import json
import time
import urllib.error
import urllib.request


class FencedStore:
    """What your database, bucket or API should do: keep the largest
    fencing token seen, and refuse writes that carry a smaller one."""

    def __init__(self):
        self.highest, self.value = 0, None

    def write(self, fencing_token: int, value: str) -> bool:
        if fencing_token < self.highest:
            return False
        self.highest, self.value = fencing_token, value
        return True


def call(base: str, method: str, path: str, body=None):
    """(status, JSON) of one control API request."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--control", default="http://127.0.0.1:4041")
    p.add_argument("--lock", default="report")
    args = p.parse_args()
    base, lock, store = args.control, args.lock, FencedStore()

    status, a = call(base, "POST", f"/locks/{lock}?ttl=2s&wait=10s&owner=worker-a")
    if status != 200:
        print(f"worker A could not take the lock: {status} {a}")
        return 1
    print(f"worker A holds {lock} (fencing token {a['fencing_token']}, ttl {a['ttl_ms']} ms)")
    assert store.write(a["fencing_token"], "written by A")

    # A stalls here and does not renew; B waits for the lock meanwhile.
    start = time.monotonic()
    status, b = call(base, "POST", f"/locks/{lock}?ttl=30s&wait=20s&owner=worker-b")
    if status != 200:
        print(f"worker B did not get the lock: {status} {b}")
        return 1
    print(f"worker B holds {lock} after {time.monotonic() - start:.1f} s (fencing token {b['fencing_token']})")
    assert store.write(b["fencing_token"], "written by B")

    # A wakes up and carries on as if it still held the lock.
    refused = not store.write(a["fencing_token"], "late write by A")
    status, _ = call(base, "POST", f"/locks/{lock}/renew", {"token": a["token"]})
    print(f"worker A's late write refused by the store: {refused}; its renewal: {status}")

    status, _ = call(base, "DELETE", f"/locks/{lock}", {"token": b["token"]})
    print(f"worker B released {lock}: {status}; the store holds {store.value!r}")
    ok = refused and b["fencing_token"] > a["fencing_token"] and store.value == "written by B"
    return 0 if ok and status == 200 else 1


if __name__ == "__main__":
    raise SystemExit(main())
