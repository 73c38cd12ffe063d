#!/usr/bin/env python3
"""Plots the planner's desired replicas over a replayed step change of load (2 -> 8 requests/s at
t = 120 s, 60 s window) against the offline calculation with the same cost model.

Runs the unit test tests/unit/planner_test.cc (PlannerTest.ReplayedStepChangeReachesOfflineReplicas)
with SLUICE_PLANNER_TRACE_CSV set, then plots the CSV:

  python3 bench/planner_replay_plot.py [--unit-tests build/bin/unit_tests] [--out bench/results/planner_replay.png]
"""

import argparse
import csv
import os
import subprocess
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unit-tests", default="build/bin/unit_tests")
    ap.add_argument("--out", default="bench/results/planner_replay.png")
    args = ap.parse_args()
    path = os.path.join(tempfile.mkdtemp(), "planner_replay.csv")
    subprocess.run([args.unit_tests, "--gtest_filter=PlannerTest.ReplayedStepChangeReachesOfflineReplicas"],
                   env={**os.environ, "SLUICE_PLANNER_TRACE_CSV": path}, check=True,
                   stdout=subprocess.DEVNULL)
    rows = list(csv.DictReader(open(path)))
    t = [float(r["t_seconds"]) for r in rows]
    fig, (ax_rate, ax_rep) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax_rate.plot(t, [float(r["arrival_rate"]) for r in rows], color="gray")
    ax_rate.set_ylabel("windowed arrival rate (req/s)")
    ax_rate.axvline(120, color="black", linestyle=":", linewidth=1)
    for pool, color in (("prefill", "tab:blue"), ("decode", "tab:orange")):
        ax_rep.step(t, [int(r[f"desired_{pool}"]) for r in rows], where="post", color=color,
                    label=f"planner: {pool}")
        ax_rep.plot(t, [int(r[f"offline_{pool}"]) for r in rows], "o", color=color,
                    markersize=3, fillstyle="none", label=f"offline: {pool}")
    ax_rep.axvline(120, color="black", linestyle=":", linewidth=1)
    ax_rep.set_xlabel("time (s); load steps from 2 to 8 requests/s at 120 s")
    ax_rep.set_ylabel("desired replicas")
    ax_rep.legend(loc="upper left")
    fig.suptitle("Planner under a step change of load (TTFT SLO 1 s, ITL SLO 50 ms)")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out} ({len(rows)} plans)")


if __name__ == "__main__":
    main()
