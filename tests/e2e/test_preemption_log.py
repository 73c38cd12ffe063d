"""Every preemption is logged as it happens, per request, and counted under the same cause.

`sluice serve` with a KV cache far smaller than the requests in flight need: running requests
outgrow it and are preempted. Each preemption writes one `recompute {json}` line (services/common/
recompute_log.h) naming the request, the cause and what happens to it (`mode`: recompute), and
`sluice_recomputes_total{cause}` / `sluice_preemptions_total{cause}` count exactly those lines.
"""

import concurrent.futures
import json
import pathlib
import re
import urllib.request

import openai
import pytest

from conftest import MODEL_NAME, ServerProcess

NUM_REQUESTS = 4
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def tiny_server():
    # 8 blocks of 16 tokens: about two requests' worth for four requests of ~55 tokens each.
    proc = ServerProcess(["--num-kv-blocks", "8", "--max-model-len", "128",
                          "--max-num-seqs", str(NUM_REQUESTS)])
    yield proc
    proc.stop()


def metric_samples(text, name):
    """{labels: value} of every sample of `name`."""
    out = {}
    for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        out[m.group(1) or ""] = float(m.group(2))
    return out


def test_each_preemption_is_logged_with_its_request_cause_and_mode(tiny_server):
    client = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="x", timeout=300,
                           max_retries=0)

    def run(i):
        r = client.completions.create(
            model=MODEL_NAME, prompt=f"Request {i}: list some kinds of trees and rivers.",
            max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True})
        return r.id, r.choices[0].finish_reason, r.usage.completion_tokens

    with concurrent.futures.ThreadPoolExecutor(NUM_REQUESTS) as pool:
        results = list(pool.map(run, range(NUM_REQUESTS)))
    # Preempted requests still complete, every token once.
    assert all(reason == "length" and n == MAX_TOKENS for _, reason, n in results), results
    ids = {rid for rid, _, _ in results}

    with urllib.request.urlopen(tiny_server.url + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    tiny_server.log.flush()
    log = pathlib.Path(tiny_server.log.name).read_text(errors="replace")
    lines = [json.loads(m) for m in re.findall(r" recompute (\{.*\})$", log, re.M)]
    preempted = [line for line in lines if line["preempted"]]
    assert preempted, "four requests on 8 blocks must preempt"
    def request_of(engine_id):
        # The engine's id of a choice: the response id, "-<index>" after it for completions.
        return engine_id if engine_id in ids else engine_id.rsplit("-", 1)[0]

    for line in preempted:
        assert request_of(line["request_id"]) in ids, (line, ids)
        assert line["cause"] in ("out_of_kv_blocks", "waiting_head_blocked"), line
        assert line["mode"] == "recompute", line
        assert line["blocks_freed"] > 0 and line["tokens_to_recompute"] > 0, line
        assert request_of(line["needed_by"]) in ids, line
    recomputes = metric_samples(metrics, "sluice_recomputes_total")
    preemptions = metric_samples(metrics, "sluice_preemptions_total")
    # One sample per cause; each equals its log lines (no other recompute happened here).
    assert set(recomputes) == {f'{{cause="{c}"}}' for c in (
        "out_of_kv_blocks", "waiting_head_blocked", "swa_replay_failed",
        "kvstore_swa_replay_failed")}, recomputes
    for cause in ("out_of_kv_blocks", "waiting_head_blocked"):
        logged = sum(line["cause"] == cause for line in preempted)
        assert recomputes[f'{{cause="{cause}"}}'] == logged, (cause, logged, recomputes)
        assert preemptions[f'{{cause="{cause}"}}'] == logged, (cause, logged, preemptions)
    assert recomputes['{cause="swa_replay_failed"}'] == 0
    assert recomputes['{cause="kvstore_swa_replay_failed"}'] == 0
    assert len(lines) == len(preempted)
