#!/usr/bin/env bash
# Overload: wrk opens far more connections than the upstream can serve
# (capacity 8 at once, ~50 ms a request), for a bounded time. Accounts
# from the client side (a wrk script counts every request it sends and
# every answer by status code) and from the gateway's own counts, and
# reports its peak memory (VmHWM) before and after, so "every request
# gets an answer and memory stays bounded" is measured. Requests still in
# flight when wrk's time runs out are neither answered nor lost (wrk stops
# reading them): they are reported apart, at most one per connection.
#
# Usage: bench/gateway-overload.sh [CONNECTIONS=800] [SECONDS=10]
# Needs: wrk (Debian package), a release build (built here).
set -euo pipefail
cd "$(dirname "$0")/.."
conns=${1:-800}
secs=${2:-10}
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)"; exit 1; }
source bench/lib.sh
up=$(port); gw=$(port); admin=$(port)

spawn "$bin" sim-server --port "$up" --profile tiny --model m --max-concurrency 8 --decode-tps 200
cat >"$work/gateway.yaml" <<EOF
apiVersion: gpuscale.io/v1alpha1
kind: Gateway
metadata: {name: overload}
spec:
  listen: 127.0.0.1:$gw
  admin: 127.0.0.1:$admin
  adminTokenFile: $(admin_token)
  queue: {maxQueue: 64, queueTimeout: 1s}
  models:
    - name: m
      maxConcurrency: 8
      replicas: ["http://127.0.0.1:$up"]
EOF
spawn "$bin" gateway --config "$work/gateway.yaml"
gw_pid=$spawned
for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$admin/readyz" && break; sleep 0.1; done

# Every request sent and every answer by status, per wrk thread, summed
# at the end.
cat >"$work/count.lua" <<'LUA'
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args)
  sent = 0
  statuses = {}
  body = '{"model":"m","prompt":"hello","max_tokens":10}'
end
function request()
  sent = sent + 1
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
function response(status, headers, b)
  statuses[status] = (statuses[status] or 0) + 1
end
function done(summary, latency, requests)
  local s, by = 0, {}
  for _, t in ipairs(threads) do
    s = s + t:get("sent")
    for code, n in pairs(t:get("statuses")) do by[code] = (by[code] or 0) + n end
  end
  io.write(string.format("client sent %d\n", s))
  for code, n in pairs(by) do io.write(string.format("client status %d %d\n", code, n)) end
end
LUA

hwm() { awk '/VmHWM/ {print $2}' "/proc/$gw_pid/status"; }
before=$(hwm)
wrk -t2 -c"$conns" -d"${secs}s" --timeout 5s -s "$work/count.lua" "http://127.0.0.1:$gw/v1/completions" >"$work/wrk.txt"
after_first=$(hwm)
wrk -t2 -c"$conns" -d"${secs}s" --timeout 5s -s "$work/count.lua" "http://127.0.0.1:$gw/v1/completions" >"$work/wrk2.txt"
after=$(hwm)
curl -s "http://127.0.0.1:$admin/metrics" >"$work/metrics.txt"
python3 - "$work/wrk.txt" "$work/wrk2.txt" "$work/metrics.txt" "$before" "$after_first" "$after" "$conns" "$secs" <<'PY'
import re, sys
def wrk(path):
    t = open(path).read()
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", t)
    sent = int(re.search(r"client sent (\d+)", t).group(1))
    by = {int(c): int(n) for c, n in re.findall(r"client status (\d+) (\d+)", t)}
    return tuple(map(int, sock.groups())) if sock else (0, 0, 0, 0), sent, by
m = open(sys.argv[3]).read()
def count(code):
    x = re.search(r'gpuscale_requests_total\{model="m",code="%s"\} (\d+)' % code, m)
    return int(x.group(1)) if x else 0
runs = [wrk(sys.argv[1]), wrk(sys.argv[2])]
conns = int(sys.argv[7])
sent = sum(r[1] for r in runs)
by = {}
for r in runs:
    for c, n in r[2].items():
        by[c] = by.get(c, 0) + n
answered = sum(by.values())
sock = [sum(r[0][i] for r in runs) for i in range(4)]
other = {c: n for c, n in by.items() if c not in (200, 429, 503)}
cut = sent - answered - sock[1] - sock[3]
print(f"wrk -t2 -c{conns} -d{sys.argv[8]}s ×2 against capacity 8 (maxQueue 64, queueTimeout 1s)\n")
print("| | count |\n|---|---:|")
print(f"| requests sent (client) | {sent} |")
print(f"| answers read (client): 200 / 429 / 503 | {by.get(200, 0)} / {by.get(429, 0)} / {by.get(503, 0)} |")
print(f"| other statuses (client) | {sum(other.values())} {other if other else ''} |")
print(f"| socket errors (connect/read/write/timeout) | {'/'.join(map(str, sock))} |")
print(f"| in flight when wrk's time ran out | {cut} (at most {2 * conns}) |")
print(f"| gateway: 200 / 429 / 503 | {count(200)} / {count(429)} / {count(503)} |")
print(f"| gateway peak RSS before / after run 1 / after run 2 | {int(sys.argv[4])//1024} / {int(sys.argv[5])//1024} / {int(sys.argv[6])//1024} MiB |")
gw = count(200) + count(429) + count(503)
ok = not other and sock[1] + sock[3] == 0 and 0 <= cut <= 2 * conns and gw >= answered
print(f"\nevery request answered: {'yes' if ok else 'NO'} (client: {sent} sent = {answered} answered + {cut} cut off at the end; gateway counted {gw})")
PY
