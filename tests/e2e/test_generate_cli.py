"""`sluice generate`: offline batch inference over JSONL, answers in input order."""

import json
import subprocess

from conftest import MODEL_DIR, MODEL_NAME, sluice_bin


def test_generate_jsonl(tmp_path, client):
    lines = [
        {"custom_id": "chat-1", "messages": [{"role": "user", "content": "Hi there"}],
         "max_tokens": 8, "temperature": 0},
        {"id": "cmpl-2", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0},
        {"custom_id": "bad-3", "prompt": "x", "top_p": 5},
        {"custom_id": "batch-4", "url": "/v1/completions",
         "body": {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 8,
                  "temperature": 0}},
    ]
    src = tmp_path / "in.jsonl"
    dst = tmp_path / "out.jsonl"
    src.write_text("\n".join(json.dumps(l) for l in lines) + "\n\nnot json\n")
    proc = subprocess.run([sluice_bin(), "generate", "--model", str(MODEL_DIR), "--input",
                           str(src), "--output", str(dst)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(l) for l in dst.read_text().splitlines()]
    assert len(out) == 5
    assert out[0]["custom_id"] == "chat-1"
    assert out[0]["object"] == "chat.completion"
    assert out[0]["usage"]["completion_tokens"] <= 8
    assert out[1]["custom_id"] == "cmpl-2"
    assert out[1]["object"] == "text_completion"
    assert out[2]["custom_id"] == "bad-3"
    assert out[2]["error"]["param"] == "top_p"
    assert out[2]["error"]["message"] == "line 3: 'top_p' must be in (0, 1], got 5"
    assert out[3]["custom_id"] == "batch-4"
    assert out[3]["choices"][0]["text"] == out[1]["choices"][0]["text"]
    assert "error" in out[4]
    # The blank line 5 has no output line; the errors still name their input lines.
    assert out[4]["error"]["message"].startswith("line 6: ")
    # Greedy: the same as the server.
    served = client.completions.create(model=MODEL_NAME, prompt="Once upon a time",
                                       max_tokens=8, temperature=0)
    assert out[1]["choices"][0]["text"] == served.choices[0].text
    assert "5/5" in proc.stderr


def test_batch_invariant_mode_gives_the_default_modes_outputs(tmp_path):
    """On the CPU backend `--batch-invariant` only asserts what the kernels already do: seeded
    sampled outputs and their logprobs are the default mode's, bit for bit."""
    lines = [{"custom_id": f"r{i}", "prompt": f"Line {i}: the river", "max_tokens": 6,
              "temperature": 0.9, "seed": 40 + i, "logprobs": 3} for i in range(6)]
    outputs = []
    for flags in ([], ["--batch-invariant"]):
        src, dst = tmp_path / "in.jsonl", tmp_path / f"out{len(flags)}.jsonl"
        src.write_text("".join(json.dumps(line) + "\n" for line in lines))
        proc = subprocess.run([sluice_bin(), "generate", "--model", str(MODEL_DIR), "--input",
                               str(src), "--output", str(dst), "--no-progress", *flags],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert f"batch invariant {'on' if flags else 'off'}" in proc.stderr
        outputs.append([(r["seed"], r["choices"][0]["text"], r["choices"][0]["logprobs"])
                        for r in map(json.loads, dst.read_text().splitlines())])
    assert outputs[0] == outputs[1]
    assert [o[0] for o in outputs[0]] == [40 + i for i in range(6)]
