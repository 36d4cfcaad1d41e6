#!/usr/bin/env bash
# User-space instructions per proxied request, gateway vs nginx, counted by
# callgrind (valgrind): a number that does not move with the machine's
# load, unlike requests/s on a shared 2-core box. Each proxy runs alone
# under callgrind (nginx with one worker, the gateway with one worker),
# in front of the `instant` simulated server; wrk sends a warm-up, the
# counters are zeroed, wrk sends the measured load, the counters are
# dumped and divided by the requests wrk completed. Kernel work (socket
# reads and writes) is not counted: `gateway-vs-nginx.sh` reports CPU time
# per request, kernel included.
#
# Usage: bench/gateway-instructions.sh [SECONDS=4]
# Needs: valgrind, wrk, nginx (Debian packages), a release build (built here).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-4}
for tool in valgrind callgrind_control wrk nginx python3; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install valgrind wrk nginx-light)"; exit 1; }
done
source bench/lib.sh
up=$(port)
spawn "$bin" sim-server --port "$up" --profile instant --model m
post_lua '{"model":"m","prompt":"hello","max_tokens":1}'

# Runs "$@" (a proxy listening on $proxy_port) under callgrind; prints
# instructions per request.
measure() {
  local out="$work/callgrind-$1.out" url="http://127.0.0.1:$proxy_port/v1/completions"
  shift
  spawn valgrind --tool=callgrind --callgrind-out-file="$out" "$@"
  local pid=$spawned
  ready "$url" >/dev/null
  wrk -t1 -c8 -d2s -s "$work/post.lua" "$url" >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  wrk -t1 -c8 -d"${secs}s" -s "$work/post.lua" "$url" >"$work/wrk.txt"
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  python3 - "$work/wrk.txt" "$out".* <<'PY'
import re, sys
requests = int(re.search(r"(\d+) requests in", open(sys.argv[1]).read()).group(1))
# The first dump after zeroing holds the measured load (later parts: exit).
first = sorted(sys.argv[2:], key=lambda p: int(p.rsplit(".", 1)[1]))[0]
total = int(re.search(r"^(?:summary|totals): (\d+)", open(first).read(), re.M).group(1))
print(f"{total // requests}\t{requests}")
PY
}

proxy_port=$(port)
gateway_conf "$proxy_port" "$(port)" "$up" | sed 's/^spec:/spec:\n  workers: 1/' >"$work/gateway.yaml"
read -r gw_ir gw_n < <(measure gateway "$bin" gateway --config "$work/gateway.yaml")
proxy_port=$(port)
nginx_conf "$proxy_port" "$up" 1 | sed 's/^worker_processes 1;/worker_processes 1;\nmaster_process off;/' >"$work/nginx.conf"
read -r ng_ir ng_n < <(measure nginx nginx -c "$work/nginx.conf")

echo "callgrind, wrk -t1 -c8 -d${secs}s, POST /v1/completions, one worker each"
echo
echo "| proxy | requests | user-space instructions/request |"
echo "|---|---:|---:|"
echo "| nginx | $ng_n | $ng_ir |"
echo "| gateway | $gw_n | $gw_ir |"
echo
python3 -c "print(f'instructions ratio (gateway/nginx): {$gw_ir / $ng_ir:.2f}')"
