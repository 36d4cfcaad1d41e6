#!/usr/bin/env bash
# Reaction time of the embedded autoscaler, measured from outside: the
# wall-clock time from a client's first request of a burst to the
# decision that reacts to it (the `at` of the change in `/v1/decisions`,
# millisecond RFC 3339; same machine, same clock). Two cases, each
# repeated: from zero (a request for a model at zero replicas: KEDA's
# activation through the gateway's scale-from-zero signal), and a burst
# on top of steady load (the queue stream's push; the 100 ms gap between
# pushed decisions is deferred, not dropped). Prints every trial, then
# the median and the worst of each case.
#
# Usage: bench/autoscaler-reaction.sh [TRIALS=5]
# Needs: python3, a release build (built here).
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-5}
source bench/lib.sh
traffic=$(port); gw_admin=$(port); admin=$(port)
cat >"$work/policies.yaml" <<EOF
apiVersion: gpuscale.io/v1alpha1
kind: ModelPolicy
metadata: {name: cold}
spec:
  servedName: bench/cold
  resources: {memoryGiB: 3, compute: 0.05, maxConcurrency: 4}
  scaling: {minReplicas: 0, maxReplicas: 4, targetQueueDepth: 4, scaleToZeroAfter: 3s, startupTime: 200ms}
---
apiVersion: gpuscale.io/v1alpha1
kind: ModelPolicy
metadata: {name: warm}
spec:
  servedName: bench/warm
  resources: {memoryGiB: 18, compute: 0.3, maxConcurrency: 4}
  scaling:
    minReplicas: 1
    maxReplicas: 10
    targetQueueDepth: 4
    startupTime: 200ms
    behavior: {scaleDown: {stabilizationWindow: 2s}}
EOF
cat >"$work/gateway.yaml" <<EOF
apiVersion: gpuscale.io/v1alpha1
kind: Gateway
metadata: {name: reaction}
spec:
  listen: 127.0.0.1:$traffic
  admin: 127.0.0.1:$gw_admin
  policies: [policies.yaml]
  queue: {maxQueue: 1000, queueTimeout: 60s}
EOF
cat >"$work/autoscaler.yaml" <<EOF
apiVersion: gpuscale.io/v1alpha1
kind: Autoscaler
metadata: {name: reaction}
spec:
  policies: [policies.yaml]
  gateway: {config: gateway.yaml}
  interval: 1s
  admin: 127.0.0.1:$admin
  tuning: {stableWindow: 2s}
  local: {profile: tiny, drainTime: 200ms}
EOF
spawn "$bin" autoscaler --config "$work/autoscaler.yaml"
for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$admin/healthz" && break; sleep 0.1; done

python3 - "$traffic" "$admin" "$trials" <<'PY'
import datetime, http.client, json, statistics, sys, threading, time

traffic, admin, trials = sys.argv[1], sys.argv[2], int(sys.argv[3])

def call(port, method, path, body=None, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=timeout)
    c.request(method, path, body=body, headers={"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data

def decisions():
    return json.loads(call(admin, "GET", "/v1/decisions")[1])

def at(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()

def wait(what, check, limit=60):
    end = time.time() + limit
    while time.time() < end:
        if check(decisions()):
            return
        time.sleep(0.1)
    sys.exit(f"timed out waiting for {what}")

def request(model, tokens):
    body = json.dumps({"model": model, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": "hi"}]})
    return call(traffic, "POST", "/v1/chat/completions", body)[0]

def first_change_after(model, t0, above):
    """Seconds from t0 to the first recorded change of `model` to more
    than `above` replicas, or None."""
    for h in decisions()[model]["history"]:
        if at(h["at"]) >= t0 - 0.001 and h["desired"] > above:
            return at(h["at"]) - t0
    return None

def burst(model, n, tokens):
    threads = [threading.Thread(target=request, args=(model, tokens)) for _ in range(n)]
    for t in threads:
        t.start()
    return threads

results = {"from zero": [], "burst on steady load": []}
for trial in range(trials):
    # From zero: the model idles down to zero, then 8 requests at once.
    wait("cold at zero", lambda d: d["cold"]["desired"] == 0)
    t0 = time.time()
    threads = burst("bench/cold", 8, 20)
    end = time.time() + 10
    r = None
    while r is None and time.time() < end:
        time.sleep(0.05)
        r = first_change_after("cold", t0, 0)
    for t in threads:
        t.join()
    results["from zero"].append(r)
    print(f"trial {trial + 1}: from zero {r * 1000:.0f} ms" if r is not None else "from zero: no change seen")

    # Burst on steady load: 3 clients keep one replica near its target,
    # then 40 requests arrive at once.
    wait("warm back at 1", lambda d: d["warm"]["desired"] == 1)
    stop = threading.Event()
    def steady():
        while not stop.is_set():
            request("bench/warm", 100)
    steadies = [threading.Thread(target=steady) for _ in range(3)]
    for s in steadies:
        s.start()
    time.sleep(3)
    base = decisions()["warm"]["desired"]
    t0 = time.time()
    threads = burst("bench/warm", 40, 100)
    end = time.time() + 10
    r = None
    while r is None and time.time() < end:
        time.sleep(0.05)
        r = first_change_after("warm", t0, base)
    stop.set()
    for t in threads + steadies:
        t.join()
    results["burst on steady load"].append(r)
    print(f"trial {trial + 1}: burst on steady load ({base} → more) {r * 1000:.0f} ms" if r is not None else "burst: no change seen")

print()
for case, rs in results.items():
    got = [r for r in rs if r is not None]
    if got:
        print(f"{case}: median {statistics.median(got) * 1000:.0f} ms, worst {max(got) * 1000:.0f} ms over {len(got)} trials ({len(rs) - len(got)} without a change)")
    else:
        print(f"{case}: no change seen")
PY
