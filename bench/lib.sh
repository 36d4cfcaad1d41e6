# Shared set-up of the gateway benchmark scripts (sourced, not run): the
# release binary, a scratch directory and background processes cleaned up
# on exit, free loopback ports, the POST body wrk sends.
#
# After sourcing: $bin (release gpuscale, or $GPUSCALE_BIN), $work (scratch dir), `spawn CMD…`
# (start in the background, output to $work/processes.log, killed on
# exit; its pid in $spawned),
# `port` (a free loopback port), `post_lua BODY` (writes $work/post.lua).

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# GPUSCALE_BIN: a release binary built already (skips the build).
if [ -n "${GPUSCALE_BIN:-}" ]; then
  bin=$GPUSCALE_BIN
else
  cargo build --release --quiet --bin gpuscale
  bin=$PWD/target/release/gpuscale
fi
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

spawn() {
  "$@" >>"$work/processes.log" 2>&1 &
  spawned=$!
  pids+=("$spawned")
}

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Writes a random admin token to $work/admin-token (once) and prints its
# path.
admin_token() {
  [ -f "$work/admin-token" ] || python3 -c 'import os; print(os.urandom(24).hex())' >"$work/admin-token"
  echo "$work/admin-token"
}

post_lua() {
  cat >"$work/post.lua" <<LUA
wrk.method = "POST"
wrk.body = '$1'
wrk.headers["Content-Type"] = "application/json"
LUA
}

# nginx as a reverse proxy on 127.0.0.1:$1 to the upstream on port $2,
# with upstream keepalive; $3 worker processes (default auto).
nginx_conf() {
  mkdir -p "$work/nginx"
  cat <<CONF
worker_processes ${3:-auto};
pid $work/nginx/nginx-$1.pid;
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
  upstream model { server 127.0.0.1:$2; keepalive 256; }
  server {
    listen 127.0.0.1:$1;
    location / {
      proxy_pass http://model;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
CONF
}

# A gateway config: traffic on $1, admin on $2, model `m` on the upstream
# port $3; secured as shipped: an admin token from a file, and the
# priority header ignored (no trusted source configured).
gateway_conf() {
  admin_token >/dev/null
  cat <<CONF
apiVersion: gpuscale.io/v1alpha1
kind: Gateway
metadata:
  name: bench
spec:
  listen: 127.0.0.1:$1
  admin: 127.0.0.1:$2
  adminTokenFile: $work/admin-token
  queue:
    maxQueue: 4096
  models:
    - name: m
      maxConcurrency: 4096
      replicas: ["http://127.0.0.1:$3"]
CONF
}

# Waits until a POST to URL answers.
ready() {
  for _ in $(seq 100); do
    curl -sf -o /dev/null -X POST -H 'content-type: application/json' \
      -d '{"model":"m","prompt":"x","max_tokens":1}' "$1" && return 0
    sleep 0.1
  done
  echo "$1 never answered"
  exit 1
}
