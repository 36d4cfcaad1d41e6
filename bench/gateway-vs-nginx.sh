#!/usr/bin/env bash
# wrk drives (a) the gpuscale gateway and (b) nginx as a reverse proxy with
# upstream keepalive, both in front of the same fast upstream (the simulated
# model server, profile `instant`), in the same run, alternating rounds.
# Reports requests/s and p50/p99 latency per round, medians, and ratios.
#
# Usage: bench/gateway-vs-nginx.sh [ROUNDS=3] [SECONDS=10] [CONNECTIONS=64]
# Needs: wrk, nginx (Debian packages), a release build (built here).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
secs=${2:-10}
conns=${3:-64}

for tool in wrk nginx python3; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install wrk nginx-light)"; exit 1; }
done
cargo build --release --quiet --bin gpuscale
bin=$PWD/target/release/gpuscale

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up_port=$(port); gw_port=$(port); admin_port=$(port); nginx_port=$(port)

"$bin" sim-server --port "$up_port" --profile instant --model m >"$work/sim.log" 2>&1 &
pids+=($!)

cat >"$work/gateway.yaml" <<EOF
apiVersion: gpuscale.io/v1alpha1
kind: Gateway
metadata:
  name: bench
spec:
  listen: 127.0.0.1:$gw_port
  admin: 127.0.0.1:$admin_port
  queue:
    maxQueue: 4096
  models:
    - name: m
      maxConcurrency: 4096
      replicas: ["http://127.0.0.1:$up_port"]
EOF
"$bin" gateway --config "$work/gateway.yaml" >"$work/gateway.log" 2>&1 &
pids+=($!)

mkdir -p "$work/nginx"
cat >"$work/nginx.conf" <<EOF
worker_processes auto;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
daemon off;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fastcgi;
  uwsgi_temp_path $work/nginx/uwsgi;
  scgi_temp_path $work/nginx/scgi;
  upstream model { server 127.0.0.1:$up_port; keepalive 256; }
  server {
    listen 127.0.0.1:$nginx_port;
    location / {
      proxy_pass http://model;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
EOF
nginx -c "$work/nginx.conf" &
pids+=($!)

cat >"$work/post.lua" <<'EOF'
wrk.method = "POST"
wrk.body = '{"model":"m","prompt":"hello","max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
EOF

ready() { for _ in $(seq 100); do curl -sf -o /dev/null -X POST -H 'content-type: application/json' \
  -d '{"model":"m","prompt":"x","max_tokens":1}' "$1" && return 0; sleep 0.1; done; echo "$1 never answered"; exit 1; }
ready "http://127.0.0.1:$gw_port/v1/completions"
ready "http://127.0.0.1:$nginx_port/v1/completions"

# Warm both.
for p in $gw_port $nginx_port; do
  wrk -t2 -c"$conns" -d2s -s "$work/post.lua" "http://127.0.0.1:$p/v1/completions" >/dev/null
done

results="$work/results.tsv"
for r in $(seq "$rounds"); do
  for target in nginx gateway; do
    if [ "$target" = nginx ]; then p=$nginx_port; else p=$gw_port; fi
    wrk -t2 -c"$conns" -d"${secs}s" --latency -s "$work/post.lua" \
      "http://127.0.0.1:$p/v1/completions" >"$work/wrk-$target-$r.txt"
    python3 - "$work/wrk-$target-$r.txt" "$target" "$r" >>"$results" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
def ms(v, unit):
    return float(v) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
lat = {p: ms(v, u) for p, v, u in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)}
errors = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
sock = re.search(r"Socket errors: (.*)", text)
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{rps:.0f}\t{lat['50']:.3f}\t{lat['99']:.3f}\t"
      f"{errors.group(1) if errors else 0}\t{sock.group(1) if sock else 'none'}")
EOF
  done
done

python3 - "$results" "$rounds" "$secs" "$conns" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
print(f"wrk -t2 -c{sys.argv[4]} -d{sys.argv[3]}s, POST /v1/completions, {sys.argv[2]} alternating rounds\n")
print("| round | proxy | requests/s | p50 ms | p99 ms | non-2xx | socket errors |")
print("|---:|---|---:|---:|---:|---:|---|")
for t, r, rps, p50, p99, bad, sock in rows:
    print(f"| {r} | {t} | {rps} | {p50} | {p99} | {bad} | {sock} |")
med = {}
for t in ("nginx", "gateway"):
    sel = [r for r in rows if r[0] == t]
    med[t] = [statistics.median(float(r[i]) for r in sel) for i in (2, 3, 4)]
print("\n| median | requests/s | p50 ms | p99 ms |")
print("|---|---:|---:|---:|")
for t in ("nginx", "gateway"):
    rps, p50, p99 = med[t]
    print(f"| {t} | {rps:.0f} | {p50:.3f} | {p99:.3f} |")
print(f"\np99 ratio (gateway/nginx): {med['gateway'][2] / med['nginx'][2]:.2f}")
print(f"throughput ratio (gateway/nginx): {med['gateway'][0] / med['nginx'][0]:.2f}")
EOF
