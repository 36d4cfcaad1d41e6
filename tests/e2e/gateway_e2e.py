#!/usr/bin/env python3
"""End to end: the gateway in front of a simulated model server, driven by
the official OpenAI Python client, scraped by a real Prometheus server.

Checks, in order:
  1. chat completions through the gateway with the `openai` client, plain
     and streamed, content exactly what the simulated server generates;
  2. `promtool check metrics` accepts the gateway's exposition;
  3. with requests held in the gateway's queue, a real Prometheus server
     scraping the admin port answers the PromQL query
     `gpuscale_queue_depth{model="sim-model"}` with the queue depth that
     `/v1/queues` reports. The admin listener is exposed (0.0.0.0) as in
     Kubernetes, so it needs a token: Prometheus runs the job shipped in
     deploy/prometheus/scrape.yaml, with the read-only token from a file
     (`authorization.credentials_file`), and a request without a token
     gets 401. Debian's Prometheus has no Kubernetes discovery, so the
     job's `kubernetes_sd_configs` become `static_configs` carrying the
     labels that discovery would give the gateway's two ports: its
     relabelling keeps the admin port and drops the traffic port;
  4. SIGTERM: `/readyz` turns 503 at once while the gateway still
     answers (drain.announce), then it exits 0.

Usage: gateway_e2e.py PATH/TO/gpuscale   (exit 0 on success)
"""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error

import yaml
import urllib.parse
import urllib.request

import openai

MODEL = "sim-model"
# An API key with a rate of its own (its SHA-256 in the config, the key
# itself only here).
LIMITED_KEY = "e2e-limited-" + os.urandom(8).hex()
WORDS = ["gpu", "scale", "packs", "models", "onto", "slices", "quickly", "today"]


def expected_text(tokens):
    return "".join(WORDS[i % len(WORDS)] + " " for i in range(tokens))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5, token=None):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


def wait_until(what, check, timeout=30):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            ok, last = check()
            if ok:
                return last
        except Exception as e:  # not up yet
            last = e
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}: {last}")


def main():
    binary = os.path.abspath(sys.argv[1])
    work = tempfile.mkdtemp(prefix="gpuscale-e2e-")
    procs = []
    failed = True

    def start(name, args):
        log = open(os.path.join(work, f"{name}.log"), "w")
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        procs.append((name, p))
        return p

    try:
        sim_port, gw_port, admin_port, prom_port = (free_port() for _ in range(4))
        # One request at a time, ~10 ms per token: easy to saturate.
        start("sim", [binary, "sim-server", "--port", str(sim_port), "--profile", "tiny",
                      "--model", MODEL, "--max-concurrency", "1", "--decode-tps", "100"])
        token = "e2e-" + os.urandom(16).hex()
        token_file = os.path.join(work, "admin-token")
        with open(token_file, "w") as f:
            f.write(token + "\n")
        # Off loopback the gateway refuses a token file every user may read.
        os.chmod(token_file, 0o600)
        read_token = "e2e-read-" + os.urandom(16).hex()
        read_token_file = os.path.join(work, "read-token")
        with open(read_token_file, "w") as f:
            f.write(read_token + "\n")
        os.chmod(read_token_file, 0o600)
        config = os.path.join(work, "gateway.yaml")
        with open(config, "w") as f:
            f.write(f"""apiVersion: gpuscale.io/v1alpha1
kind: Gateway
metadata:
  name: e2e
spec:
  listen: 127.0.0.1:{gw_port}
  admin: 0.0.0.0:{admin_port}
  adminTokenFile: admin-token
  readTokenFile: read-token
  drain:
    announce: 2s
    timeout: 1s
  queue:
    maxQueue: 64
    queueTimeout: 120s
  priorities:
    apiKeys:
      - name: limited
        sha256: {hashlib.sha256(LIMITED_KEY.encode()).hexdigest()}
        rate: {{requestsPerMinute: 1, burst: 1}}
  models:
    - name: {MODEL}
      maxConcurrency: 1
      replicas: ["http://127.0.0.1:{sim_port}"]
      metrics: vllm
""")
        start("gateway", [binary, "gateway", "--config", config])
        admin = f"http://127.0.0.1:{admin_port}"
        wait_until("the gateway", lambda: (get(admin + "/readyz")[0] == 200, "ready"))
        wait_until("the simulated server",
                   lambda: (get(f"http://127.0.0.1:{sim_port}/health")[0] == 200, "up"))

        # 1. The official OpenAI client through the gateway.
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{gw_port}/v1", api_key="unused",
                               max_retries=0, timeout=30)
        models = [m.id for m in client.models.list().data]
        assert models == [MODEL], models
        chat = client.chat.completions.create(
            model=MODEL, max_tokens=12,
            messages=[{"role": "user", "content": "Say something about GPUs."}])
        assert chat.choices[0].message.content == expected_text(12), chat
        assert chat.usage.completion_tokens == 12, chat.usage
        stream = client.chat.completions.create(
            model=MODEL, max_tokens=9, stream=True,
            messages=[{"role": "user", "content": "Stream it."}])
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
        assert "".join(pieces) == expected_text(9), pieces
        assert len([p for p in pieces if p]) == 9, pieces
        try:
            client.chat.completions.create(model="no-such-model",
                                           messages=[{"role": "user", "content": "x"}])
            raise SystemExit("an unknown model must fail")
        except openai.NotFoundError as e:
            assert "does not exist" in str(e), e
        print("openai client: plain and streamed chat completions ok")

        # A key with a rate of its own: its second request is refused
        # before it is queued, as the client library's RateLimitError,
        # with the seconds until the next; other clients are not touched.
        limited = openai.OpenAI(base_url=f"http://127.0.0.1:{gw_port}/v1",
                                api_key=LIMITED_KEY, max_retries=0, timeout=30)
        limited.chat.completions.create(model=MODEL, max_tokens=1,
                                        messages=[{"role": "user", "content": "x"}])
        try:
            limited.chat.completions.create(model=MODEL, max_tokens=1,
                                            messages=[{"role": "user", "content": "x"}])
            raise SystemExit("the limited key's second request must be refused")
        except openai.RateLimitError as e:
            after = int(e.response.headers["retry-after"])
            assert 30 <= after <= 60, after
            assert isinstance(e.body, dict) and e.body.get("type") == "rate_limit_exceeded", e.body
        client.chat.completions.create(model=MODEL, max_tokens=1,
                                       messages=[{"role": "user", "content": "x"}])
        print("openai client: a key past its rate gets RateLimitError with Retry-After")

        # 2. promtool accepts the exposition; the exposed admin port wants
        # the token.
        try:
            get(admin + "/metrics")
            raise SystemExit("an exposed admin port served /metrics without the token")
        except urllib.error.HTTPError as e:
            assert e.code == 401, e
        _, text = get(admin + "/metrics", token=token)
        lint = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                              capture_output=True)
        if lint.returncode != 0:
            print(text)
            raise SystemExit(f"promtool check metrics failed: {lint.stdout}{lint.stderr}")
        print("promtool check metrics: ok")

        # 3. Prometheus scrapes the gateway; PromQL sees the queue.
        shipped = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                               "..", "..", "deploy", "prometheus", "scrape.yaml")
        with open(shipped) as f:
            jobs = yaml.safe_load(f)
        job = next(j for j in jobs if j["job_name"] == "gpuscale-gateway")
        del job["kubernetes_sd_configs"]
        pod = {"__meta_kubernetes_namespace": "gpuscale",
               "__meta_kubernetes_pod_name": "gpuscale-gateway-7d9c-x2x",
               "__meta_kubernetes_pod_label_app_kubernetes_io_name": "gpuscale-gateway"}
        job["static_configs"] = [
            {"targets": [f"127.0.0.1:{admin_port}"],
             "labels": {**pod, "__meta_kubernetes_pod_container_port_name": "admin"}},
            {"targets": [f"127.0.0.1:{gw_port}"],
             "labels": {**pod, "__meta_kubernetes_pod_container_port_name": "http"}},
        ]
        job["authorization"]["credentials_file"] = read_token_file
        prom_config = os.path.join(work, "prometheus.yml")
        with open(prom_config, "w") as f:
            yaml.safe_dump({"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                            "scrape_configs": [job]}, f)
        check = subprocess.run(["promtool", "check", "config", prom_config],
                               capture_output=True, text=True)
        if check.returncode != 0:
            raise SystemExit(f"promtool check config: {check.stdout}{check.stderr}")
        start("prometheus", ["prometheus", f"--config.file={prom_config}",
                             f"--storage.tsdb.path={os.path.join(work, 'tsdb')}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"])
        prom = f"http://127.0.0.1:{prom_port}"
        wait_until("prometheus", lambda: (get(prom + "/-/ready")[0] == 200, "ready"))

        # Prometheus has scraped the gateway once before the queue fills.
        def target_up():
            targets = json.loads(get(prom + "/api/v1/targets")[1])["data"]["activeTargets"]
            return bool(targets) and targets[0]["health"] == "up", targets
        targets = wait_until("prometheus to scrape the gateway", target_up)
        # The relabelling kept the admin port only, named its pod, and the
        # read token was enough.
        assert [t["scrapeUrl"] for t in targets] == [f"http://127.0.0.1:{admin_port}/metrics"], \
            targets
        assert targets[0]["labels"]["pod"] == "gpuscale-gateway-7d9c-x2x", targets[0]["labels"]
        dropped = json.loads(get(prom + "/api/v1/targets?state=dropped")[1])["data"]
        assert [t["discoveredLabels"]["__address__"] for t in dropped["droppedTargets"]] \
            == [f"127.0.0.1:{gw_port}"], dropped
        print("deploy/prometheus/scrape.yaml's gateway job: the admin port scraped with the "
              "read token, the traffic port dropped")

        # Hold the queue: 1 runs, 7 wait, each ~30 s (3,000 tokens at 100/s),
        # so the depth stays put while Prometheus scrapes it.
        held = 8
        def one():
            try:
                client.completions.create(model=MODEL, prompt="hold", max_tokens=3000)
            except Exception:
                pass  # cut short when the gateway stops at the end
        threads = [threading.Thread(target=one, daemon=True) for _ in range(held)]
        for t in threads:
            t.start()

        def queue_view():
            _, body = get(admin + "/v1/queues", token=token)
            q = json.loads(body)["models"][MODEL]
            return q["waiting"] == held - 1 and q["in_flight"] == 1, q
        q = wait_until("the queue to fill", queue_view)
        print("/v1/queues:", json.dumps(q))

        query = f'gpuscale_queue_depth{{model="{MODEL}"}}'
        def promql():
            url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
            _, body = get(url)
            result = json.loads(body)["data"]["result"]
            value = float(result[0]["value"][1]) if result else None
            return value == held - 1, result
        result = wait_until(f"PromQL {query} to return {held - 1}", promql, timeout=20)
        print(f"PromQL {query} -> {result[0]['value'][1]}: ok")
        _, text = get(admin + "/metrics", token=token)
        ok = [l for l in text.splitlines()
              if l.startswith(f'gpuscale_requests_total{{model="{MODEL}",code="200"}}')]
        # The two completions of step 1, the limited key's first and the
        # one after its refusal.
        assert ok and float(ok[0].split()[-1]) == 4, ok

        # 4. SIGTERM: not ready at once, still answering, then gone.
        gateway = next(p for name, p in procs if name == "gateway")
        gateway.terminate()
        def not_ready():
            try:
                get(admin + "/readyz")
                return False, "ready"
            except urllib.error.HTTPError as e:
                return e.code == 503, e.code
        wait_until("/readyz to turn 503 after SIGTERM", not_ready, timeout=1.5)
        try:
            client.chat.completions.create(model=MODEL, max_tokens=1,
                                           messages=[{"role": "user", "content": "x"}])
            raise SystemExit("a request during the drain must be refused")
        except openai.APIStatusError as e:
            assert e.status_code == 503, e
            assert e.response.headers.get("retry-after"), e.response.headers
        code = gateway.wait(timeout=20)
        assert code == 0, f"the gateway exited {code} after SIGTERM"
        print("SIGTERM: /readyz 503 and requests 503 + Retry-After during the drain, exit 0")
        print("gateway e2e passed")
        failed = False
    finally:
        for name, p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        if os.environ.get("KEEP_E2E"):
            print("logs in", work)
        else:
            for name, _ in procs:
                log = os.path.join(work, f"{name}.log")
                if os.path.exists(log) and failed:
                    print(f"--- {name}.log ---")
                    print(open(log).read()[-4000:])
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
