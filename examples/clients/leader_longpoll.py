#!/usr/bin/env python3
"""Follow a leader-elector sidecar's /leader by long-poll (Python stdlib only).

Do leader-only work while /leader says this replica leads, and stop it the
moment it says otherwise. Each request returns as soon as the sidecar's
transition count (`X-Leader-Index`) differs from the one we pass, or after
`wait`; so a change is seen at once, without polling.

    python3 leader_longpoll.py [--url http://127.0.0.1:4040] [--changes N]

--changes N exits 0 after N changes were seen (for tests); without it, it
runs until interrupted. Exit 1 when the sidecar cannot be reached for 30 s.
"""
import argparse
import json
import time
import urllib.error
import urllib.request


def ask(url: str, index, wait: str) -> dict:
    """One /leader answer (200 and 503 both carry the JSON state)."""
    query = f"?index={index}&wait={wait}" if index is not None else ""
    # The request may be held for `wait`: allow a little more than that.
    try:
        with urllib.request.urlopen(url + "/leader" + query, timeout=40) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:  # 503: not the leader (or not known)
        return json.load(e)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:4040")
    p.add_argument("--wait", default="30s")
    p.add_argument("--changes", type=int, default=0)
    args = p.parse_args()
    index, leading, seen, down_since = None, None, 0, None
    while True:
        try:
            state = ask(args.url, index, args.wait)
            down_since = None
        except (OSError, ValueError) as e:
            down_since = down_since or time.monotonic()
            if time.monotonic() - down_since > 30:
                print(f"error: {args.url} unreachable for 30 s: {e}", flush=True)
                return 1
            time.sleep(0.5)
            continue
        if index is not None and state["transitions"] != index:
            seen += 1
        index = state["transitions"]
        if state["is_leader"] != leading:
            leading = state["is_leader"]
            if leading:
                # Start leader-only work here; pass the fencing token along.
                print(f"leading (fencing token {state['fencing_token']})", flush=True)
            else:
                # Stop leader-only work here, at once.
                print(f"following {state.get('leader') or 'nobody'}", flush=True)
        if args.changes and seen >= args.changes:
            return 0


if __name__ == "__main__":
    raise SystemExit(main())
