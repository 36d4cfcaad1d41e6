#!/usr/bin/env bash
# wrk drives (a) the gpuscale gateway and (b) nginx as a reverse proxy with
# upstream keepalive, both in front of the same fast upstream (the simulated
# model server, profile `instant`), in the same run, alternating rounds.
# Reports requests/s and p50/p99 latency per round, medians, and ratios.
#
# Usage: bench/gateway-vs-nginx.sh [ROUNDS=3] [SECONDS=10] [CONNECTIONS=64] [PROMPT_BYTES=0]
# PROMPT_BYTES 0 sends the prompt "hello" (shorter than one routing block:
# no prefix key); 1024, say, sends a prompt that long, which the gateway's
# default routing (prefix) reads and hashes on every request.
# Needs: wrk, nginx (Debian packages), a release build (built here).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
secs=${2:-10}
conns=${3:-64}
prompt_bytes=${4:-0}

for tool in wrk nginx python3; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install wrk nginx-light)"; exit 1; }
done
source bench/lib.sh
up_port=$(port); gw_port=$(port); admin_port=$(port); nginx_port=$(port)

spawn "$bin" sim-server --port "$up_port" --profile instant --model m
gateway_conf "$gw_port" "$admin_port" "$up_port" >"$work/gateway.yaml"
spawn "$bin" gateway --config "$work/gateway.yaml"
gateway_pid=$spawned
nginx_conf "$nginx_port" "$up_port" >"$work/nginx.conf"
spawn nginx -c "$work/nginx.conf"
nginx_pid=$spawned

if [ "$prompt_bytes" -gt 0 ]; then
  prompt=$(python3 -c 'import sys; n=int(sys.argv[1]); print(("the quick brown fox jumps over the lazy dog " * (n // 44 + 1))[:n])' "$prompt_bytes")
else
  prompt=hello
fi
post_lua "{\"model\":\"m\",\"prompt\":\"$prompt\",\"max_tokens\":1}"
ready "http://127.0.0.1:$gw_port/v1/completions"
ready "http://127.0.0.1:$nginx_port/v1/completions"

# Warm both.
for p in $gw_port $nginx_port; do
  wrk -t2 -c"$conns" -d2s -s "$work/post.lua" "http://127.0.0.1:$p/v1/completions" >/dev/null
done

# CPU time (user + system, clock ticks) of a proxy: the gateway's process,
# or nginx's master and workers.
cpu_ticks() {
  local procs total=0
  if [ "$1" = nginx ]; then procs="$nginx_pid $(pgrep -P "$nginx_pid" | tr '\n' ' ')"; else procs=$gateway_pid; fi
  for p in $procs; do
    read -r -a f <"/proc/$p/stat"
    total=$((total + f[13] + f[14]))
  done
  echo "$total"
}
hz=$(getconf CLK_TCK)

results="$work/results.tsv"
for r in $(seq "$rounds"); do
  for target in nginx gateway; do
    if [ "$target" = nginx ]; then p=$nginx_port; else p=$gw_port; fi
    before=$(cpu_ticks "$target")
    wrk -t2 -c"$conns" -d"${secs}s" --latency -s "$work/post.lua" \
      "http://127.0.0.1:$p/v1/completions" >"$work/wrk-$target-$r.txt"
    ticks=$(( $(cpu_ticks "$target") - before ))
    python3 - "$work/wrk-$target-$r.txt" "$target" "$r" "$ticks" "$hz" >>"$results" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
def ms(v, unit):
    return float(v) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
total = int(re.search(r"(\d+) requests in", text).group(1))
cpu_us = int(sys.argv[4]) / int(sys.argv[5]) * 1e6 / total
lat = {p: ms(v, u) for p, v, u in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)}
errors = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
sock = re.search(r"Socket errors: (.*)", text)
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{rps:.0f}\t{lat['50']:.3f}\t{lat['99']:.3f}\t"
      f"{cpu_us:.1f}\t{errors.group(1) if errors else 0}\t{sock.group(1) if sock else 'none'}")
EOF
  done
done

python3 - "$results" "$rounds" "$secs" "$conns" "${#prompt} bytes" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
print(f"wrk -t2 -c{sys.argv[4]} -d{sys.argv[3]}s, POST /v1/completions, prompt of {sys.argv[5]}, {sys.argv[2]} alternating rounds\n")
print("| round | proxy | requests/s | p50 ms | p99 ms | proxy CPU µs/request | non-2xx | socket errors |")
print("|---:|---|---:|---:|---:|---:|---:|---|")
for t, r, rps, p50, p99, cpu, bad, sock in rows:
    print(f"| {r} | {t} | {rps} | {p50} | {p99} | {cpu} | {bad} | {sock} |")
med = {}
for t in ("nginx", "gateway"):
    sel = [r for r in rows if r[0] == t]
    med[t] = [statistics.median(float(r[i]) for r in sel) for i in (2, 3, 4, 5)]
print("\n| median | requests/s | p50 ms | p99 ms | proxy CPU µs/request |")
print("|---|---:|---:|---:|---:|")
for t in ("nginx", "gateway"):
    rps, p50, p99, cpu = med[t]
    print(f"| {t} | {rps:.0f} | {p50:.3f} | {p99:.3f} | {cpu:.1f} |")
print(f"\nproxy CPU per request ratio (gateway/nginx): {med['gateway'][3] / med['nginx'][3]:.2f}")
print(f"\np99 ratio (gateway/nginx): {med['gateway'][2] / med['nginx'][2]:.2f}")
print(f"throughput ratio (gateway/nginx): {med['gateway'][0] / med['nginx'][0]:.2f}")
EOF
