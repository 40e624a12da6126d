#!/bin/sh
# Follow a leader-elector sidecar's /leader by long-poll (POSIX sh and curl).
# Prints "leading" or "following" on every change; each request returns as
# soon as the transition count (X-Leader-Index) differs from the one passed.
#
#   leader_longpoll.sh [URL] [CHANGES]     # URL default http://127.0.0.1:4040
#
# With CHANGES it exits 0 after that many changes (for tests); otherwise it
# runs until interrupted.
url=${1:-http://127.0.0.1:4040}
changes=${2:-0}
index=""
seen=0
state=""
while :; do
  query=""
  [ -n "$index" ] && query="?index=$index&wait=30s"
  # -w prints the status after the headers; 200 leads, 503 does not.
  out=$(curl -s -D - -o /dev/null --max-time 40 -w '%{http_code}' "$url/leader$query") || { sleep 1; continue; }
  code=$(printf '%s\n' "$out" | tail -n 1)
  new=$(printf '%s\n' "$out" | tr -d '\r' | sed -n 's/^[Xx]-[Ll]eader-[Ii]ndex: *//p')
  [ -n "$new" ] || { sleep 1; continue; }
  if [ -n "$index" ] && [ "$new" != "$index" ]; then seen=$((seen + 1)); fi
  index=$new
  if [ "$code" = 200 ]; then now=leading; else now=following; fi
  if [ "$now" != "$state" ]; then
    state=$now
    echo "$state"            # start or stop the leader-only work here
  fi
  if [ "$changes" -gt 0 ] && [ "$seen" -ge "$changes" ]; then exit 0; fi
done
