#!/usr/bin/env python3
"""Plots the planner's desired replicas over a replayed step change of load (2 -> 8 requests/s at
t = 120 s, 60 s window) against the offline calculation with the same cost model.

Runs the unit tests tests/unit/planner_test.cc PlannerTest.ReplayedStepChangeReachesOfflineReplicas
(text model: prefill, decode) with SLUICE_PLANNER_TRACE_CSV set and
PlannerTest.VisionReplayReachesOfflineReplicasForEveryPool (4 images per request: prefill, decode,
encoder) with SLUICE_PLANNER_VISION_TRACE_CSV set, then plots each CSV:

  python3 bench/planner_replay_plot.py [--unit-tests build/bin/unit_tests] \
      [--out bench/results/planner_replay.png] [--vision-out bench/results/planner_replay_vision.png]
"""

import argparse
import csv
import os
import subprocess
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def replay(unit_tests, test, env_var):
    path = os.path.join(tempfile.mkdtemp(), "planner_replay.csv")
    subprocess.run([unit_tests, f"--gtest_filter=PlannerTest.{test}"],
                   env={**os.environ, env_var: path}, check=True, stdout=subprocess.DEVNULL)
    return list(csv.DictReader(open(path)))


def plot(rows, pools, title, out):
    t = [float(r["t_seconds"]) for r in rows]
    fig, (ax_rate, ax_rep) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax_rate.plot(t, [float(r["arrival_rate"]) for r in rows], color="gray")
    ax_rate.set_ylabel("windowed arrival rate (req/s)")
    ax_rate.axvline(120, color="black", linestyle=":", linewidth=1)
    colors = {"prefill": "tab:blue", "decode": "tab:orange", "encoder": "tab:green"}
    for pool in pools:
        ax_rep.step(t, [int(r[f"desired_{pool}"]) for r in rows], where="post",
                    color=colors[pool], label=f"planner: {pool}")
        ax_rep.plot(t, [int(r[f"offline_{pool}"]) for r in rows], "o", color=colors[pool],
                    markersize=3, fillstyle="none", label=f"offline: {pool}")
    ax_rep.axvline(120, color="black", linestyle=":", linewidth=1)
    ax_rep.set_xlabel("time (s); load steps from 2 to 8 requests/s at 120 s")
    ax_rep.set_ylabel("desired replicas")
    ax_rep.legend(loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out} ({len(rows)} plans)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unit-tests", default="build/bin/unit_tests")
    ap.add_argument("--out", default="bench/results/planner_replay.png")
    ap.add_argument("--vision-out", default="bench/results/planner_replay_vision.png")
    args = ap.parse_args()
    plot(replay(args.unit_tests, "ReplayedStepChangeReachesOfflineReplicas",
                "SLUICE_PLANNER_TRACE_CSV"), ("prefill", "decode"),
         "Planner under a step change of load (TTFT SLO 1 s, ITL SLO 50 ms)", args.out)
    plot(replay(args.unit_tests, "VisionReplayReachesOfflineReplicasForEveryPool",
                "SLUICE_PLANNER_VISION_TRACE_CSV"), ("prefill", "decode", "encoder"),
         "Planner, vision model (4 images/request, 25 % encoder cache hits; TTFT 1 s, "
         "encode share 0.4)", args.vision_out)


if __name__ == "__main__":
    main()
