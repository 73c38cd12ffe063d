"""Every serving pod kind exposes vLLM's metric families, with values that match known traffic.

`sluice serve`, the router, a prefill and a decode worker are scraped after a fixed set of
greedy chats whose usage the client saw. Checked on each pod: the families and label sets a
gateway or dashboard reads (vllm:num_requests_running / waiting, vllm:kv_cache_usage_perc, the
token counters, vllm:request_success_total by finished_reason, the TTFT / inter-token / e2e /
queue / prefill / decode histograms with vLLM's bucket bounds), counts and sums that follow from
the usage, and `promtool check metrics` reporting nothing but the ':' in the vllm: names.
"""

import concurrent.futures
import json
import math
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import openai
import pytest

from sluice_cluster import (MODEL_NAME, Cluster, Serve, http_get, promtool_problems, sum_samples,
                            wait_until)

# vLLM's bounds (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0]
REQUEST_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": TTFT_BUCKETS,
    "vllm:inter_token_latency_seconds": TPOT_BUCKETS,
    "vllm:time_per_output_token_seconds": TPOT_BUCKETS,
    "vllm:e2e_request_latency_seconds": REQUEST_BUCKETS,
    "vllm:request_queue_time_seconds": REQUEST_BUCKETS,
    "vllm:request_inference_time_seconds": REQUEST_BUCKETS,
    "vllm:request_prefill_time_seconds": REQUEST_BUCKETS,
    "vllm:request_decode_time_seconds": REQUEST_BUCKETS,
}
GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
COUNTERS = ["vllm:prompt_tokens_total", "vllm:generation_tokens_total",
            "vllm:request_success_total", "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total"]
ALLOWED_LABELS = {"model_name", "finished_reason", "le", "block_size", "num_gpu_blocks"}

# (max_tokens, ignore_eos): the ignore_eos ones finish by length with exactly max_tokens tokens.
REQUESTS = [(6, True), (9, True), (4, True), (12, False), (16, False), (7, True)]


def chat(client, i):
    max_tokens, ignore_eos = REQUESTS[i]
    r = client.chat.completions.create(
        model=MODEL_NAME, temperature=0, max_tokens=max_tokens,
        extra_body={"ignore_eos": ignore_eos},
        messages=[{"role": "user", "content": f"vLLM metrics question {i}: name {i + 2} rivers."}])
    return r.choices[0].finish_reason, r.usage.prompt_tokens, r.usage.completion_tokens


def run_traffic(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=120, max_retries=0)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        return list(pool.map(lambda i: chat(client, i), range(len(REQUESTS))))


def samples(text, name):
    """[(labels dict, value)] of metric `name`."""
    out = []
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$", line)
        if m:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(1) or ""))
            out.append((labels, float(m.group(2))))
    return out


def one(text, name, **labels):
    found = [v for l, v in samples(text, name) if all(l.get(k) == x for k, x in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def check_families(text):
    """Every family present once with vLLM's type, model_name label and buckets; no other labels."""
    types = dict(re.findall(r"^# TYPE (vllm:\S+) (\S+)$", text, re.M))
    for name in GAUGES:
        assert types.get(name) == "gauge", name
        assert one(text, name, model_name=MODEL_NAME) >= 0
    for name in COUNTERS:
        assert types.get(name) == "counter", name
    for name, bounds in HISTOGRAMS.items():
        assert types.get(name) == "histogram", name
        les = [l["le"] for l, _ in samples(text, name + "_bucket")]
        assert [float(x) for x in les[:-1]] == bounds and les[-1] == "+Inf", (name, les)
        counts = [v for _, v in samples(text, name + "_bucket")]
        assert counts == sorted(counts), (name, counts)  # cumulative
        assert counts[-1] == one(text, name + "_count", model_name=MODEL_NAME)
    reasons = {l["finished_reason"] for l, _ in samples(text, "vllm:request_success_total")}
    assert reasons == {"stop", "length", "abort"}, reasons
    for line in text.splitlines():
        if line.startswith("vllm:"):
            labels = set(re.findall(r'(\w+)="', line.split(" ")[0]))
            assert labels <= ALLOWED_LABELS, line
            if not line.startswith("vllm:cache_config_info"):
                assert f'model_name="{MODEL_NAME}"' in line, line
    if shutil.which("promtool"):
        assert promtool_problems(text) == [], text


def expected(results):
    return {
        "n": len(results),
        "prompt": sum(p for _, p, _ in results),
        "completion": sum(c for _, _, c in results),
        "stop": sum(r == "stop" for r, _, _ in results),
        "length": sum(r == "length" for r, _, _ in results),
        # The front end observes one inter-token latency per token after the first.
        "itl": sum(c - 1 for _, _, c in results),
    }


def check_front_end(text, want):
    """serve and router: the API front end saw every request from arrival to its last token."""
    check_families(text)
    m = lambda name, **l: one(text, name, model_name=MODEL_NAME, **l)
    assert m("vllm:prompt_tokens_total") == want["prompt"]
    assert m("vllm:generation_tokens_total") == want["completion"]
    assert m("vllm:request_success_total", finished_reason="stop") == want["stop"]
    assert m("vllm:request_success_total", finished_reason="length") == want["length"]
    assert m("vllm:request_success_total", finished_reason="abort") == 0
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                 "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds"):
        assert m(name + "_count") == want["n"], name
    assert m("vllm:inter_token_latency_seconds_count") == want["itl"]
    assert m("vllm:time_per_output_token_seconds_count") == want["itl"]
    # Phases add up: queue + prefill + decode <= e2e, TTFT <= e2e; prefill and decode > 0.
    e2e = m("vllm:e2e_request_latency_seconds_sum")
    parts = sum(m(f"vllm:request_{p}_time_seconds_sum") for p in ("queue", "prefill", "decode"))
    assert 0 < parts <= e2e * 1.0001 + 1e-6, (parts, e2e)
    assert 0 < m("vllm:time_to_first_token_seconds_sum") <= e2e
    assert m("vllm:request_prefill_time_seconds_sum") > 0
    assert m("vllm:request_decode_time_seconds_sum") > 0
    inference = m("vllm:request_inference_time_seconds_sum")
    assert inference == pytest.approx(m("vllm:request_prefill_time_seconds_sum") +
                                      m("vllm:request_decode_time_seconds_sum"), rel=1e-9)


@pytest.fixture(scope="module")
def serve():
    s = Serve()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(num_prefill=1, num_decode=1)
    yield c
    c.stop()


def test_serve_pod(serve):
    want = expected(run_traffic(serve.url))
    assert want["length"] >= 4  # the ignore_eos ones
    text = http_get(serve.url + "/metrics")[1]
    check_front_end(text, want)
    m = lambda name: one(text, name, model_name=MODEL_NAME)
    wait_until(lambda: sum_samples(http_get(serve.url + "/metrics")[1],
                                   "vllm:num_requests_running") == 0, 10, "serve idle")
    text = http_get(serve.url + "/metrics")[1]
    assert m("vllm:num_requests_waiting") == 0
    assert m("vllm:kv_cache_usage_perc") == sum_samples(text, "sluice_kv_cache_usage_ratio")
    # Each chat's prompt has full blocks, all looked up in the prefix cache.
    assert m("vllm:prefix_cache_queries_total") == \
        sum_samples(text, "sluice_prefix_cache_queries_total") > 0


def test_router_prefill_decode_pods(cluster):
    results = run_traffic(cluster.url)
    want = expected(results)
    router = http_get(cluster.url + "/metrics")[1]
    check_front_end(router, want)

    for name in ("prefill-0", "decode-0"):
        wait_until(lambda: cluster.worker_metric(name, "vllm:num_requests_running") == 0 and
                   cluster.worker_metric(name, "vllm:kv_cache_usage_perc") == 0, 30,
                   f"{name} idle")
    prefill = cluster.worker_metrics_text("prefill-0")
    decode = cluster.worker_metrics_text("decode-0")
    check_families(prefill)
    check_families(decode)
    p = lambda name, **l: one(prefill, name, model_name=MODEL_NAME, **l)
    d = lambda name, **l: one(decode, name, model_name=MODEL_NAME, **l)
    # Requests that ended at their first token never reach the decode worker.
    handed = [(r, pt, c) for r, pt, c in results if c > 1]
    n = len(results)

    # Prefill pod: every prompt once, one token each; a request handed to decode ends "length"
    # there (vLLM's prefill instances run max_tokens=1); no decode phase, no inter-token latency.
    assert p("vllm:prompt_tokens_total") == want["prompt"]
    assert p("vllm:generation_tokens_total") == n
    assert p("vllm:request_success_total", finished_reason="length") == \
        len(handed) + sum(r == "length" for r, _, c in results if c == 1)
    assert p("vllm:time_to_first_token_seconds_count") == n
    assert p("vllm:e2e_request_latency_seconds_count") == n
    assert p("vllm:request_queue_time_seconds_count") == n
    assert p("vllm:request_prefill_time_seconds_count") == n
    assert p("vllm:request_decode_time_seconds_count") == 0
    assert p("vllm:inter_token_latency_seconds_count") == 0
    assert p("vllm:e2e_request_latency_seconds_sum") == \
        pytest.approx(p("vllm:time_to_first_token_seconds_sum"), rel=1e-9)

    # Decode pod: the tokens after the first, finish reasons as the client saw them; its first
    # output (the second token) is its TTFT, each later one an inter-token latency.
    assert d("vllm:prompt_tokens_total") == sum(pt for _, pt, _ in handed)
    assert d("vllm:generation_tokens_total") == sum(c - 1 for _, _, c in handed)
    assert d("vllm:request_success_total", finished_reason="stop") == \
        sum(r == "stop" for r, _, _ in handed)
    assert d("vllm:request_success_total", finished_reason="length") == \
        sum(r == "length" for r, _, _ in handed)
    assert d("vllm:time_to_first_token_seconds_count") == len(handed)
    assert d("vllm:inter_token_latency_seconds_count") == sum(c - 2 for _, _, c in handed)
    for phase in ("queue", "prefill", "decode"):
        assert d(f"vllm:request_{phase}_time_seconds_count") == len(handed), phase
    assert d("vllm:request_decode_time_seconds_sum") > 0

    # Router pod: load gauges sum the workers' heartbeats; idle now.
    wait_until(lambda: sum_samples(http_get(cluster.url + "/metrics")[1],
                                   "vllm:num_requests_running") == 0, 15, "router idle")
    router = http_get(cluster.url + "/metrics")[1]
    assert one(router, "vllm:num_requests_waiting", model_name=MODEL_NAME) == 0


DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "sluice-dashboard.json"
METRIC_NAME = re.compile(r"\b((?:vllm:|sluice_)[a-zA-Z0-9_:]+)")


def dashboard_exprs():
    dash = json.loads(DASHBOARD.read_text())
    return dash, [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


def test_dashboard_is_valid_and_queries_exported_families(cluster):
    """deploy/grafana/sluice-dashboard.json: valid JSON with unique panel ids, the panels the
    operator needs, PromQL that promtool parses, and only metric names some pod exports."""
    dash, exprs = dashboard_exprs()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for needed in ("time to first token", "inter-token latency", "throughput", "kv cache usage",
                   "prefix cache hit rate", "replicas"):
        assert needed in titles, needed
    variables = {v["name"] for v in dash["templating"]["list"]}
    for _, expr in exprs:
        for var in re.findall(r"\$\{?(\w+)", expr):
            assert var in variables or var.startswith("__"), (var, expr)
    # Every family named is exported after traffic by the router or a worker.
    run_traffic(cluster.url)
    exported = http_get(cluster.url + "/metrics")[1]
    for name in cluster.workers:
        exported += cluster.worker_metrics_text(name)
    families = set(re.findall(r"^# TYPE (\S+) ", exported, re.M))
    for title, expr in exprs:
        for metric in METRIC_NAME.findall(expr):
            base = re.sub(r"_(bucket|sum|count)$", "", metric)
            assert metric in families or base in families, (title, metric)
    # The expressions parse: promtool checks them as recording rules (variables filled in).
    if shutil.which("promtool"):
        rules = {"groups": [{"name": "dashboard", "rules": [
            {"record": f"dashboard:expr_{i}",
             "expr": expr.replace("$__rate_interval", "1m").replace("$model_name", ".*")
                         .replace("$frontend_job", ".*").replace("$worker_job", ".*")}
            for i, (_, expr) in enumerate(exprs)]}]}
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(rules, f)
        result = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True,
                                text=True, timeout=30)
        assert result.returncode == 0, result.stdout + result.stderr


def test_router_planner_page_and_metric(cluster):
    """GET /v1/planner explains sluice_planner_desired_replicas{pool} with the measured load and
    the cost model fitted from the workers' steps; the numbers follow from the shown inputs."""
    run_traffic(cluster.url)
    wait_until(lambda: all(p["explanation"]["cost_model"]["steps_observed"] > 0 for p in
                           json.loads(http_get(cluster.url + "/v1/planner")[1])["pools"]),
               15, "step costs from the workers' heartbeats")
    page = json.loads(http_get(cluster.url + "/v1/planner")[1])
    assert page["object"] == "planner" and page["slo"]["ttft_seconds"] > 0
    pools = {p["pool"]: p for p in page["pools"]}
    assert set(pools) == {"prefill", "decode"}
    for pool in pools.values():
        assert pool["current_replicas"] == 1
        e = pool["explanation"]
        assert e["workload"]["requests_in_window"] >= len(REQUESTS)
        assert e["workload"]["arrival_rate_rps"] > 0
        cost = e["cost_model"]
        assert cost["fixed_seconds"] >= 0 and cost["per_token_seconds"] >= 0
        assert cost["fixed_seconds"] + cost["per_token_seconds"] > 0
    p = pools["prefill"]["explanation"]
    w = p["workload"]
    s = p["cost_model"]["fixed_seconds"] + p["cost_model"]["per_token_seconds"] * \
        (w["mean_prompt_tokens"] - w["mean_cached_tokens"])
    assert p["prefill_seconds_per_request"] == pytest.approx(s, rel=1e-9)
    if p["slo_feasible"]:
        rho = 2 * (page["slo"]["ttft_seconds"] - s) / (2 * (page["slo"]["ttft_seconds"] - s) + s)
        want = max(1, math.ceil(w["arrival_rate_rps"] * s / rho - 1e-9))
        assert pools["prefill"]["desired_replicas"] == want
    # The metric carries the same numbers (one more scrape may see a newer window: same traffic).
    metrics = http_get(cluster.url + "/metrics")[1]
    for name in ("prefill", "decode"):
        assert one(metrics, "sluice_planner_current_replicas", pool=name) == 1
        assert one(metrics, "sluice_planner_desired_replicas", pool=name) >= 1
