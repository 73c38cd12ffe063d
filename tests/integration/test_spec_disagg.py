"""Disaggregated speculative decoding: router + prefill + a decode worker running the draft
model beside the target (--speculative-model) gives the same greedy text as `sluice serve`,
and the decode worker's /metrics shows the drafts it verified."""

import openai
import pytest

from sluice_cluster import REPO, Cluster, Serve

DRAFT_DIR = REPO.parent / "shared" / "models" / "sluice-mini-draft"
PROMPTS = ["Quote Genesis 1:3.", "Tell me a fortune.", "Where is it written: \"Jesus wept.\"?",
           "Recite John 3:16 from the King James Bible."]


def chats(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=300, max_retries=0)
    out = []
    for p in PROMPTS:
        r = client.chat.completions.create(model="sluice-mini-moe", temperature=0, max_tokens=40,
                                           messages=[{"role": "user", "content": p}])
        out.append((r.choices[0].message.content, r.choices[0].finish_reason,
                    r.usage.completion_tokens))
    return out


def test_decode_worker_with_drafter_matches_serve():
    serve = Serve()
    try:
        reference = chats(serve.url)
    finally:
        serve.stop()
    cluster = Cluster(num_prefill=1, num_decode=1,
                      role_args={"decode": ["--speculative-model", str(DRAFT_DIR),
                                            # fixed k: drafts every step, whatever auto's
                                            # cost model says on this machine
                                            "--speculative-verify", "3"]})
    try:
        assert chats(cluster.url) == reference
        assert cluster.worker_metric("decode-0", "sluice_spec_decode_num_drafts_total") > 0
        assert cluster.worker_metric("decode-0", "sluice_spec_decode_num_accepted_tokens_total") > 0
    finally:
        cluster.stop()
