#!/usr/bin/env bash
# A noisy neighbour: one client (wrk from 127.0.0.1, many connections)
# sends far more than a model can serve, while another (a Python client
# from 127.0.0.2) sends five requests a second, one at a time. Reports
# what the quiet client got: answers by status and the latency of those
# served, and what the flood got, for the gateway built here and, with
# GPUSCALE_BASE_BIN, another build beside it (the same sitting).
#
# The model: one replica serving 8 at once (~50 ms a request), a queue
# of 64 and a queue timeout of 2 s, as `gateway-overload.sh`.
#
# Usage: bench/noisy-neighbour.sh [CONNECTIONS=200] [SECONDS=10]
#        GPUSCALE_BASE_BIN=/path/to/older/gpuscale bench/noisy-neighbour.sh
# Needs: wrk (Debian package), a release build (built here), Linux (the
# quiet client binds 127.0.0.2).
set -euo pipefail
cd "$(dirname "$0")/.."
conns=${1:-200}
secs=${2:-10}
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)"; exit 1; }
source bench/lib.sh

cat >"$work/quiet.py" <<'PY'
import http.client, json, sys, time
port, secs = int(sys.argv[1]), float(sys.argv[2])
body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 10})
statuses, served = {}, []
end = time.monotonic() + secs
while time.monotonic() < end:
    started = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=("127.0.0.2", 0))
    try:
        c.request("POST", "/v1/completions", body, {"content-type": "application/json"})
        r = c.getresponse()
        r.read()
        statuses[r.status] = statuses.get(r.status, 0) + 1
        if r.status == 200:
            served.append(time.monotonic() - started)
    except OSError as e:
        statuses[type(e).__name__] = statuses.get(type(e).__name__, 0) + 1
    finally:
        c.close()
    time.sleep(max(0.0, 0.2 - (time.monotonic() - started)))
served.sort()
q = lambda p: served[min(len(served) - 1, int(p * len(served)))] * 1e3 if served else float("nan")
print(json.dumps({"sent": sum(statuses.values()), "statuses": statuses,
                  "p50_ms": q(0.5), "p95_ms": q(0.95)}))
PY

cat >"$work/count.lua" <<'LUA'
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args)
  ok, refused = 0, 0
  body = '{"model":"m","prompt":"hello","max_tokens":10}'
end
function request()
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
function response(status, headers, b)
  if status == 200 then ok = ok + 1 else refused = refused + 1 end
end
function done(summary, latency, requests)
  local o, r = 0, 0
  for _, t in ipairs(threads) do o = o + t:get("ok"); r = r + t:get("refused") end
  io.write(string.format("FLOOD %d %d\n", o, r))
end
LUA

run() {
  local b=$1 up gw admin
  up=$(port); gw=$(port); admin=$(port)
  spawn "$b" sim-server --port "$up" --profile tiny --model m --max-concurrency 8 --decode-tps 200
  local sim=$spawned
  cat >"$work/gateway.yaml" <<EOF
apiVersion: gpuscale.io/v1alpha1
kind: Gateway
metadata: {name: noisy}
spec:
  listen: 127.0.0.1:$gw
  admin: 127.0.0.1:$admin
  adminTokenFile: $(admin_token)
  queue: {maxQueue: 64, queueTimeout: 2s}
  models:
    - name: m
      maxConcurrency: 8
      replicas: ["http://127.0.0.1:$up"]
EOF
  spawn "$b" gateway --config "$work/gateway.yaml"
  local g=$spawned
  ready "http://127.0.0.1:$gw/v1/completions" >/dev/null
  wrk -t2 -c"$conns" -d"$((secs + 2))s" -s "$work/count.lua" "http://127.0.0.1:$gw/v1/completions" >"$work/wrk.txt" &
  local w=$!
  sleep 1
  python3 "$work/quiet.py" "$gw" "$secs" >"$work/quiet.json"
  wait "$w"
  kill "$g" "$sim" 2>/dev/null || true
  wait "$g" "$sim" 2>/dev/null || true
  python3 - "$b" "$work/quiet.json" "$work/wrk.txt" <<'PY'
import json, sys
q = json.load(open(sys.argv[2]))
flood = next(l.split() for l in open(sys.argv[3]) if l.startswith("FLOOD"))
s = q["statuses"]
print(f"| {sys.argv[1]} | {q['sent']} | {s.get('200', 0)} | {s.get('429', 0)} | {s.get('503', 0)} "
      f"| {q['p50_ms']:.0f} / {q['p95_ms']:.0f} | {int(flood[1]):,} / {int(flood[2]):,} |")
PY
}

echo "| build | quiet client: sent | 200 | 429 | 503 | served p50 / p95 ms | flood: 200 / refused |"
echo "|---|---:|---:|---:|---:|---|---|"
run "$bin"
if [ -n "${GPUSCALE_BASE_BIN:-}" ]; then
  run "$GPUSCALE_BASE_BIN"
fi
