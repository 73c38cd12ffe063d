"""Grammar engine comparison: Sluice (bench/grammar_bench.cc) vs xgrammar and llguidance on the
same JSON Schemas and GBNF grammars, the same documents and the same vocabulary, in one run.

    .venv/bin/python bench/grammar/compare.py \
        --tokenizer ../shared/tokenizers/llama3/tokenizer.json --bench build/bin/grammar_bench \
        --out bench/results/grammar_llama3

Per case: compile time (the fastest of --compile_repeats, caches off, one thread each) and the
time to fill the next-token bitmask before each token of the document and once at its end
(p50 / p99; per step the fastest of --mask_repeats passes, each with a fresh matcher, so a pass
preempted on a shared machine does not count; every engine is timed the same way), and
Sluice's figures as ratios to xgrammar's (below 1: Sluice faster). xgrammar's masks are timed
from Python around one call into its C++ (`xgrammar_call_floor_us`: the median of a call that
does nothing, the share of each figure that is the crossing); Sluice's inside C++.
Writes <out>.json and <out>.png. Engines that cannot be imported are reported as skipped with
the reason. Requirements: tests/requirements*.txt (xgrammar, without torch: see
tests/testing/xgrammar_cpu.py) and bench/grammar/requirements.txt (llguidance).
"""

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests" / "testing"))
import xgrammar_cpu  # noqa: E402


def dump(v):
    """Compact JSON with ", " and ": " (the separators every engine is configured with)."""
    return json.dumps(v, separators=(", ", ": "), ensure_ascii=False)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * (len(xs) - 1) + 0.5))]


def summarize(name, engine, compile_ms, mask_us, ok, n):
    return {"name": name, "engine": engine, "document_ok": ok, "num_tokens": n,
            "compile_ms": min(compile_ms), "mask_us_p50": pct(mask_us, 0.5),
            "mask_us_p99": pct(mask_us, 0.99), "mask_us_max": max(mask_us)}


def fastest_per_step(passes):
    """Per step, the fastest of the passes' times (passes that stopped early count as far as they go)."""
    n = max(len(p) for p in passes)
    return [min(p[i] for p in passes if i < len(p)) for i in range(n)]


def run_llguidance(cases, hf, ids_per_case, repeats):
    import llguidance
    import llguidance.hf
    import llguidance.numpy as lnp
    tok = llguidance.hf.from_tokenizer(hf)
    out = []
    for case, ids in zip(cases, ids_per_case):
        compile_ms = []
        for _ in range(repeats.compile):
            t0 = time.perf_counter()
            if "grammar" in case:
                from llguidance.gbnf_to_lark import gbnf_to_lark
                grammar = llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(case["grammar"]))
            else:
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    json.dumps(case["schema"], sort_keys=True),
                    defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "})
            matcher = llguidance.LLMatcher(tok, grammar)
            compile_ms.append((time.perf_counter() - t0) * 1e3)
        assert not matcher.is_error(), matcher.get_error()
        mask = lnp.allocate_token_bitmask(1, tok.vocab_size)
        passes, ok = [], True
        for _ in range(repeats.mask):
            matcher = llguidance.LLMatcher(tok, grammar)
            times = []
            for i in range(len(ids) + 1):
                t0 = time.perf_counter()
                lnp.fill_next_token_bitmask(matcher, mask, 0)
                times.append((time.perf_counter() - t0) * 1e6)
                if i == len(ids):
                    break
                if not matcher.consume_token(ids[i]):
                    ok = False
                    break
            ok = ok and matcher.is_accepting()
            passes.append(times)
        out.append(summarize(case["name"], "llguidance", compile_ms, fastest_per_step(passes), ok, len(ids)))
    return out


def run_xgrammar(cases, hf, ids_per_case, vocab_size, repeats):
    xgr = xgrammar_cpu.import_xgrammar()
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size)
    out = []
    for case, ids in zip(cases, ids_per_case):
        compile_ms = []
        for _ in range(repeats.compile):
            compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            t0 = time.perf_counter()
            if "grammar" in case:
                compiled = compiler.compile_grammar(case["grammar"], root_rule_name="root")
            else:
                compiled = compiler.compile_json_schema(json.dumps(case["schema"], sort_keys=True),
                                                        any_whitespace=False, separators=(", ", ": "))
            compile_ms.append((time.perf_counter() - t0) * 1e3)
        mask = xgrammar_cpu.allocate_bitmask(info.vocab_size)
        passes, ok = [], True
        for _ in range(repeats.mask):
            matcher = xgr.GrammarMatcher(compiled)
            times = []
            for i in range(len(ids) + 1):
                t0 = time.perf_counter()
                matcher.fill_next_token_bitmask(mask)
                times.append((time.perf_counter() - t0) * 1e6)
                if i == len(ids):
                    break
                if not matcher.accept_token(ids[i]):
                    ok = False
                    break
            passes.append(times)
        out.append(summarize(case["name"], "xgrammar", compile_ms, fastest_per_step(passes), ok, len(ids)))
    return out


def xgrammar_call_floor_us():
    """Median time of a Python call into xgrammar's C++ that does no work (is_terminated)."""
    xgr = xgrammar_cpu.import_xgrammar()
    info = xgr.TokenizerInfo([chr(c) for c in range(97, 123)])
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_regex("a"))
    times = []
    for _ in range(2000):
        t0 = time.perf_counter()
        matcher.is_terminated()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def ratios(results):
    """Sluice's figure over xgrammar's, per case and as geometric means."""
    per_case = []
    for r in results:
        if r["engine"] != "sluice":
            continue
        x = next((q for q in results if q["engine"] == "xgrammar" and q["name"] == r["name"]), None)
        if x is None:
            continue
        per_case.append({"name": r["name"], **{k: r[k] / x[k] for k in ("compile_ms", "mask_us_p50", "mask_us_p99")
                                               if x[k] > 0}})
    geo = {}
    for k in ("compile_ms", "mask_us_p50", "mask_us_p99"):
        vals = [c[k] for c in per_case if k in c and c[k] > 0]
        if vals:
            geo[k] = math.exp(sum(math.log(v) for v in vals) / len(vals))
    return {"sluice_over_xgrammar": per_case, "geometric_mean": geo}


def plot(results, ratio, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [r["name"] for r in results if r["engine"] == "sluice"]
    engines = [e for e in ("sluice", "xgrammar", "llguidance") if any(r["engine"] == e for r in results)]
    fig, axes = plt.subplots(2, 2, figsize=(16, 10))
    for ax, key, label in zip(axes.flat, ("compile_ms", "mask_us_p50", "mask_us_p99"),
                              ("compile time (ms)", "mask p50 (µs)", "mask p99 (µs)")):
        width = 0.8 / max(1, len(engines))
        for k, e in enumerate(engines):
            vals = [next((r[key] for r in results if r["name"] == n and r["engine"] == e), 0) for n in names]
            ax.bar([i + k * width for i in range(len(names))], vals, width, label=e)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))])
        ax.set_xticklabels(names, rotation=45, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_title(label)
        ax.legend()
    ax = axes.flat[3]
    rows = ratio["sluice_over_xgrammar"]
    width = 0.27
    for k, (key, label) in enumerate((("compile_ms", "compile"), ("mask_us_p50", "mask p50"),
                                      ("mask_us_p99", "mask p99"))):
        ax.bar([i + k * width for i in range(len(rows))], [r.get(key, 0) for r in rows], width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + width for i in range(len(rows))])
    ax.set_xticklabels([r["name"] for r in rows], rotation=45, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_title("Sluice / xgrammar (below 1: Sluice faster)")
    ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--bench", required=True, help="path of the grammar_bench binary")
    ap.add_argument("--cases", nargs="+", default=[str(HERE / "cases.json"), str(HERE / "ebnf_cases.json")])
    ap.add_argument("--out", required=True, help="output path without extension")
    ap.add_argument("--compile_repeats", type=int, default=5)
    ap.add_argument("--mask_repeats", type=int, default=5)
    args = ap.parse_args()
    repeats = argparse.Namespace(compile=args.compile_repeats, mask=args.mask_repeats)
    cases, results = [], []
    for path in args.cases:
        cases += json.loads(Path(path).read_text())
        sluice = subprocess.run([args.bench, "--tokenizer", args.tokenizer, "--cases", path,
                                 "--compile_repeats", str(repeats.compile), "--mask_repeats", str(repeats.mask)],
                                check=True, capture_output=True, text=True)
        results += [json.loads(line) for line in sluice.stdout.splitlines() if line.startswith("{")]

    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_file=args.tokenizer)
    # The documents exactly as the Sluice bench serialized them (its grammar orders properties
    # by sorted key; the other engines get the schemas with sorted keys too).
    docs = {r["name"]: r["document"] for r in results}
    ids_per_case = [hf.encode(docs[c["name"]], add_special_tokens=False) for c in cases]
    for c in cases:
        if "schema" in c:
            c["schema"] = json.loads(json.dumps(c["schema"], sort_keys=True))
    vocab_size = len(hf)
    skipped = {}
    for name, fn in (("llguidance", lambda: run_llguidance(cases, hf, ids_per_case, repeats)),
                     ("xgrammar", lambda: run_xgrammar(cases, hf, ids_per_case, vocab_size, repeats))):
        try:
            results += fn()
        except ImportError as e:
            skipped[name] = f"import failed: {e}"
    versions = {}
    for mod in ("llguidance", "xgrammar"):
        try:
            from importlib.metadata import version
            versions[mod] = version(mod)
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            versions[mod] = f"unknown ({e})"
    ratio = ratios(results)
    out = {"tokenizer": args.tokenizer, "vocab_size": vocab_size, "versions": versions,
           "compile_repeats": repeats.compile, "mask_repeats": repeats.mask,
           "skipped": skipped, "ratios": ratio, "results": results}
    if "xgrammar" not in skipped:
        out["xgrammar_call_floor_us"] = xgrammar_call_floor_us()
    Path(args.out + ".json").write_text(json.dumps(out, indent=1) + "\n")
    plot(results, ratio, args.out + ".png", f"JSON Schema and GBNF grammars on {Path(args.tokenizer).parent.name} "
         f"({vocab_size} tokens), one CPU thread each")
    for r in results:
        print(f'{r["name"]:18s} {r["engine"]:10s} ok={r["document_ok"]!s:5s} compile {r["compile_ms"]:9.2f} ms'
              f'  mask p50 {r["mask_us_p50"]:9.1f} us  p99 {r["mask_us_p99"]:9.1f} us')
    for r in ratio["sluice_over_xgrammar"]:
        print(f'{r["name"]:18s} sluice/xgrammar compile {r.get("compile_ms", 0):7.3f}  '
              f'mask p50 {r.get("mask_us_p50", 0):7.3f}  p99 {r.get("mask_us_p99", 0):7.3f}')
    print("geometric mean:", {k: round(v, 3) for k, v in ratio["geometric_mean"].items()},
          "xgrammar call floor (us):", out.get("xgrammar_call_floor_us"))
    if skipped:
        print("skipped:", skipped, file=sys.stderr)


if __name__ == "__main__":
    main()
