#!/usr/bin/env python3
"""End to end: `gpuscale up --load burst` watched by headless Chromium.

Runs `gpuscale up` on the examples with its built-in burst load (time
constants divided by 10, so a burst's scale-up and the scale-down after it
fit in two minutes), opens the dashboard in headless Chromium (Debian
`chromium`) over the Chrome DevTools protocol, and checks, in order:
  1. the page shows every GPU and node of examples/cluster.yaml and every
     model of examples/policies, and the GPU map places models on GPUs;
  2. the page updates live (server-sent events: `data-updated` changes
     without a reload);
  3. replicas grow under the burst, as the page shows them;
  4. a screenshot is written (argument 2, default dashboard.png);
  5. `up` itself: every request of its load is answered, replicas go up
     and back down (read from /v1/dashboard while it runs), and it exits 0
     when its --duration ends.

Usage: dashboard_e2e.py PATH/TO/gpuscale [SCREENSHOT.png]   (exit 0 on success)
"""

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket  # websocket-client (PyPI): the DevTools protocol's transport

CLUSTER_GPUS = 64
CLUSTER_NODES = ["h100-0", "h100-1", "h100-2", "h100-3", "a100-0", "a100-1", "h200-0", "l40s-0", "l40s-1"]
MODELS = 11
DURATION_S = 110


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


def wait_until(what, check, timeout=60):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            v = check()
            if v:
                return v
        except Exception as e:  # not up yet
            last = e
        time.sleep(0.3)
    raise SystemExit(f"timed out waiting for {what} (last error: {last})")


class DevTools:
    """A page in headless Chromium, driven over the DevTools protocol."""

    def __init__(self, port):
        pages = wait_until(
            "Chromium's DevTools endpoint",
            lambda: [p for p in get_json(f"http://127.0.0.1:{port}/json/list") if p["type"] == "page"],
        )
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30)
        self.next = 0

    def call(self, method, **params):
        self.next += 1
        self.ws.send(json.dumps({"id": self.next, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next:
                if "error" in msg:
                    raise SystemExit(f"{method}: {msg['error']}")
                return msg["result"]

    def eval(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"page script failed: {r['exceptionDetails']}")
        return r["result"].get("value")


PAGE_STATE = """(() => {
  if (!document.body) return { updated: null };
  const gpus = [...document.querySelectorAll('.gpu')];
  const rows = [...document.querySelectorAll('#models tbody tr')];
  return {
    updated: document.body.dataset.updated || null,
    gpus: gpus.length,
    nodes: [...new Set(gpus.map(g => g.dataset.node))],
    placed: gpus.filter(g => g.dataset.models).length,
    models: rows.map(r => r.dataset.model),
    ready: rows.reduce((s, r) => s + Number(r.dataset.ready), 0),
    desired: rows.reduce((s, r) => s + Number(r.dataset.desired), 0),
    charts: document.querySelectorAll('#charts svg').length,
  };
})()"""


def main():
    binary = sys.argv[1]
    shot = sys.argv[2] if len(sys.argv) > 2 else "dashboard.png"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        raise SystemExit("chromium not found (Debian package `chromium`)")
    traffic, admin, gw_admin, devtools = free_port(), free_port(), free_port(), free_port()
    up = subprocess.Popen(
        [binary, "up", "--load", "burst", "--duration", f"{DURATION_S}s", "--speedup", "10",
         "--port", str(traffic), "--admin-port", str(admin), "--gateway-admin-port", str(gw_admin),
         "--summary-every", "20s"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    started = time.time()
    base = f"http://127.0.0.1:{admin}"
    profile = tempfile.mkdtemp()
    browser = None
    try:
        wait_until("the dashboard", lambda: get_json(f"{base}/v1/dashboard")["nodes"])
        browser = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--remote-debugging-port={devtools}", f"--user-data-dir={profile}",
             "--window-size=1400,1800", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        page = DevTools(devtools)
        page.call("Page.enable")
        page.call("Page.navigate", url=f"{base}/")
        first = wait_until("the page's first render", lambda: (s := page.eval(PAGE_STATE))["updated"] and s)

        # 1. Every GPU, node and model; models on GPUs.
        assert first["gpus"] == CLUSTER_GPUS, first
        assert sorted(first["nodes"]) == sorted(CLUSTER_NODES), first
        assert len(first["models"]) == MODELS and "llama-3-1-8b" in first["models"], first
        assert first["placed"] > 0, f"no GPU shows a model: {first}"
        assert first["charts"] == 5, first

        # 2 and 3. Live updates while the burst (seconds 10–40) scales
        # replicas up; the API's view is sampled too for step 5.
        updates, peak_page, shot_taken = {first["updated"]}, first["ready"], False
        api_ready = []
        while time.time() - started < 75:
            s = page.eval(PAGE_STATE)
            updates.add(s["updated"])
            peak_page = max(peak_page, s["ready"])
            v = get_json(f"{base}/v1/dashboard")
            api_ready.append(sum(m["ready"] for m in v["models"]))
            if not shot_taken and s["ready"] > first["desired"] and time.time() - started > 30:
                # 4. The screenshot, with the burst's replicas on the map.
                png = page.call("Page.captureScreenshot", format="png")["data"]
                with open(shot, "wb") as f:
                    f.write(base64.b64decode(png))
                shot_taken = True
            time.sleep(1)
        assert len(updates) >= 20, f"the page updated {len(updates)} times in a minute"
        # Growth beyond the minimum the page first asked for (what the
        # models start at), not replicas merely finishing their start-up.
        assert peak_page > first["desired"], f"replicas on the page never grew past {first['desired']}: {peak_page}"
        if not shot_taken:
            png = page.call("Page.captureScreenshot", format="png")["data"]
            with open(shot, "wb") as f:
                f.write(base64.b64decode(png))
        assert os.path.getsize(shot) > 10_000, "screenshot too small"
        print(f"page: {first['gpus']} GPUs on {len(first['nodes'])} nodes, {len(first['models'])} models; "
              f"{len(updates)} live updates; replicas wanted at first {first['desired']}, ready at the peak {peak_page}; "
              f"screenshot {shot}")

        # 5. Down again after the burst, then a clean exit with every
        # request answered.
        while up.poll() is None and time.time() - started < DURATION_S - 3:
            api_ready.append(sum(m["ready"] for m in get_json(f"{base}/v1/dashboard")["models"]))
            time.sleep(1)
        peak = max(api_ready)
        assert api_ready[-1] < peak, f"replicas did not come down after the burst: {api_ready}"
        out, _ = up.communicate(timeout=180)
        print(out)
        assert up.returncode == 0, f"gpuscale up exited {up.returncode}"
        m = re.search(r"load: (\d+) requests sent, (\d+) answered \((.*)\), (\d+) failed, (\d+) timed out, "
                      r"(\d+) abandoned, (\d+) not sent", out)
        assert m, "no load line"
        sent, answered = int(m[1]), int(m[2])
        assert sent > 500 and sent == answered, m[0]
        assert m[4] == m[5] == m[6] == m[7] == "0", m[0]
        print(f"up: {sent} requests, all answered; replicas {api_ready[0]} → {peak} → {api_ready[-1]}; exit 0")
    finally:
        if browser:
            browser.kill()
        if up.poll() is None:
            up.kill()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
    print("dashboard e2e ok")
