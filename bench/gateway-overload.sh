#!/usr/bin/env bash
# Overload: wrk opens far more connections than the upstream can serve
# (capacity 8 at once, ~50 ms a request), for a bounded time. Reports what
# every request got (2xx, 429/503 with Retry-After, socket errors), the
# gateway's own counts, and its peak memory (VmHWM) before and after, so
# "every request gets an answer and memory stays bounded" is measured.
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
  queue: {maxQueue: 64, queueTimeout: 1s}
  models:
    - name: m
      maxConcurrency: 8
      replicas: ["http://127.0.0.1:$up"]
EOF
spawn "$bin" gateway --config "$work/gateway.yaml"
gw_pid=$spawned
for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$admin/readyz" && break; sleep 0.1; done
post_lua '{"model":"m","prompt":"hello","max_tokens":10}'
hwm() { awk '/VmHWM/ {print $2}' "/proc/$gw_pid/status"; }
before=$(hwm)
wrk -t2 -c"$conns" -d"${secs}s" --timeout 5s -s "$work/post.lua" "http://127.0.0.1:$gw/v1/completions" >"$work/wrk.txt"
after_first=$(hwm)
wrk -t2 -c"$conns" -d"${secs}s" --timeout 5s -s "$work/post.lua" "http://127.0.0.1:$gw/v1/completions" >"$work/wrk2.txt"
after=$(hwm)
curl -s "http://127.0.0.1:$admin/metrics" >"$work/metrics.txt"
python3 - "$work/wrk.txt" "$work/wrk2.txt" "$work/metrics.txt" "$before" "$after_first" "$after" "$conns" "$secs" <<'EOF'
import re, sys
def wrk(path):
    t = open(path).read()
    total = int(re.search(r"(\d+) requests in", t).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", t)
    return total, int(non2xx.group(1)) if non2xx else 0, tuple(map(int, sock.groups())) if sock else (0, 0, 0, 0)
m = open(sys.argv[3]).read()
def count(code):
    x = re.search(r'gpuscale_requests_total\{model="m",code="%s"\} (\d+)' % code, m)
    return int(x.group(1)) if x else 0
runs = [wrk(sys.argv[1]), wrk(sys.argv[2])]
sent = sum(r[0] for r in runs); non2xx = sum(r[1] for r in runs)
sock = [sum(r[2][i] for r in runs) for i in range(4)]
print(f"wrk -t2 -c{sys.argv[7]} -d{sys.argv[8]}s ×2 against capacity 8 (maxQueue 64, queueTimeout 1s)\n")
print("| | count |\n|---|---:|")
print(f"| responses wrk read | {sent} |")
print(f"| of which 429/503 | {non2xx} |")
print(f"| socket errors (connect/read/write/timeout) | {'/'.join(map(str, sock))} |")
print(f"| gateway: 200 / 429 / 503 | {count(200)} / {count(429)} / {count(503)} |")
print(f"| gateway peak RSS before / after run 1 / after run 2 | {int(sys.argv[4])//1024} / {int(sys.argv[5])//1024} / {int(sys.argv[6])//1024} MiB |")
answered = count(200) + count(429) + count(503)
print(f"\nevery request answered: {'yes' if answered >= sent and sock[1] + sock[3] == 0 else 'NO'} ({answered} answered by the gateway, {sent} read by wrk)")
EOF
