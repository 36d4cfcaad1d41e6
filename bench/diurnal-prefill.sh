#!/usr/bin/env bash
# The diurnal scenario with prefill-aware sizing: a copy of
# examples/policies whose chat models declare `resources.prefill` (the
# scenario's own prefill speeds per H100, and the Azure conversation
# trace's p95 prompt of 4,083 tokens, or the fixed prompt of a model that
# has one), and the gateway scraping the simulated servers' vLLM metrics
# (prefill utilisation reaches the autoscaler). Writes the copies under
# target/diurnal-prefill/ and the report to target/sim/diurnal-prefill/.
#
# Usage: bench/diurnal-prefill.sh [AUTOSCALERS=gpuscale] (a comma list of
#        gpuscale,hpa,keda,knative,static-peak)
# Needs: python3, a release build (built here). Two runs take about 10
# minutes on two cores; all ten about 50.
set -euo pipefail
cd "$(dirname "$0")/.."
compare=${1:-gpuscale}
cargo build --release --bin gpuscale >&2
out=target/diurnal-prefill
rm -rf "$out" && mkdir -p "$out/policies"
python3 - "$out" "$compare" <<'EOF'
import os, re, sys
out, compare = sys.argv[1], sys.argv[2]
root = os.getcwd()
# Per model: prompt tokens/s on an H100 (bench/scenarios/diurnal.yaml's
# `service.prefillTps`) and its p95 prompt.
prefill = {
    "llama-3-1-8b": (30000, 4083), "qwen2-5-7b": (30000, 4083),
    "mistral-7b": (30000, 600), "qwen2-5-32b": (8000, 4083),
    "mixtral-8x7b": (12000, 4083), "llama-3-1-70b": (3500, 4083),
    "qwen2-5-72b": (3500, 4083),
}
src = "examples/policies"
for f in sorted(os.listdir(src)):
    text = open(os.path.join(src, f)).read()
    if f.endswith(".yaml"):
        docs = text.split("\n---\n")
        for i, d in enumerate(docs):
            m = re.search(r"\n  name: (\S+)", d)
            if m and m.group(1) in prefill:
                tps, p95 = prefill[m.group(1)]
                d = re.sub(r"(\n    maxConcurrency: [^\n]*)",
                           r"\1" + f"\n    prefill: {{tokensPerSecond: {tps}, promptTokensP95: {p95}}}",
                           d, count=1)
                assert "prefill" in d, m.group(1)
                docs[i] = d
        text = "\n---\n".join(docs)
    open(os.path.join(out, "policies", f), "w").write(text)
s = open("bench/scenarios/diurnal.yaml").read()
s = s.replace("cluster: cluster-64.yaml", f"cluster: {root}/bench/scenarios/cluster-64.yaml")
s = s.replace("policies: [../../examples/policies]", "policies: [policies]")
s = s.replace("../data/traces/", f"{root}/bench/data/traces/")
s = s.replace("\n  duration: 24h\n",
              f"\n  duration: 24h\n  compare: [{compare}]\n  gateway: {{scrapeServerMetrics: true}}\n")
assert "scrapeServerMetrics" in s and "policies: [policies]" in s
open(os.path.join(out, "diurnal-prefill.yaml"), "w").write(s)
EOF
target/release/gpuscale simulate --scenario "$out/diurnal-prefill.yaml" --report target/sim/diurnal-prefill
