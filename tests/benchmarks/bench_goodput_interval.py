"""``bench_goodput.py --interval-check``: the checkpoint interval by the numbers on a real run.

Rank 1 is killed every ``--kill-every-s`` seconds of wall time (the benchmark's loop kills
itself: the faults come by the clock, not at a step). First a ``paced`` run: RobustTrainer
(sync) whose loop checkpoints when ``should_checkpoint()`` says, with a prior
``CheckpointConfig(mtbf_s=)`` of ``--prior-factor`` times the true MTBF (wrong on purpose:
the policy must learn the rate from the run's failures). Its event log gives the measured
checkpoint cost ``C`` (the commits' ``blocked_s``) and the interval it chose (the gap
between two commits of the same attempt, less the save itself), from its second attempt on
(the first has seen no failure yet and holds to the prior). A short fault-free run warms the
cluster first, so that the paced run, the first of the four, is not the one that meets it
cold. Daly's optimum is
``daly_interval(C, MTBF)`` for the true MTBF. Then fixed intervals, ``--factors`` times
that optimum (default 1/2, 1 and 2; a checkpoint every so many steps), run the same loop and
the same faults; the benchmark's own ETTR of each (from the loop's marks) is printed beside
the paced run's. ``--repeats N`` runs the whole set N times, the order rotated each time (no
configuration always meets the machine in the same state), and compares the medians.
A fixed interval longer than the work an attempt gets between two kills never commits and
ends at the restart budget: it is printed as DID NOT FINISH, with its ETTR up to then.
The product's figure is printed too, but here it is an upper bound: the loop's own kills
leave no event at the step they came, so the steps since rank 0's last progress are
replayed unseen.
"""

from __future__ import annotations

import statistics


def chosen_intervals(events):
    """Per attempt, the intervals the paced run kept between two commits (less the save)."""
    by_attempt = {}
    for e in sorted(events, key=lambda e: e.get("time", 0.0)):
        if e.get("kind") == "checkpoint_committed" and isinstance(e.get("attempt"), int):
            by_attempt.setdefault(e["attempt"], []).append(e)
    out = {}
    for attempt, commits in by_attempt.items():
        out[attempt] = [b["time"] - a["time"] - float(b.get("blocked_s", 0.0))
                        for a, b in zip(commits[:-1], commits[1:], strict=True)]
    return out


def costs(events):
    return [float(e["blocked_s"]) for e in events
            if e.get("kind") == "checkpoint_committed" and "blocked_s" in e]


def interval_check(args, root, run_once):
    from rayguard.checkpoint.interval import daly_interval
    from rayguard.events import read

    mtbf = args.kill_every_s
    args.mtbf_s = args.prior_factor * mtbf
    args.kills, args.hang, args.nan, args.preempt = [], -1, -1, -1
    extra = {"kill_every_s": mtbf}
    factors = [float(f) for f in args.factors.split(",") if f]
    steps, args.steps = args.steps, 20  # a warm-up: no run of the four meets a cold cluster
    run_once("sync", args, root, faults=False)
    args.steps = steps
    paced = run_once("paced", args, root, faults=False, extra=extra)
    events = read(paced["run_dir"])
    cost = statistics.mean(costs(events))
    optimum = daly_interval(cost, mtbf)
    print(f"measured checkpoint cost {cost:.3f} s, true MTBF {mtbf:.0f} s (prior "
          f"{args.mtbf_s:.0f} s): Daly's optimum {optimum:.2f} s", flush=True)
    every = {f: max(1, round(f * optimum / args.step_s)) for f in factors}
    fixed = {f"every {n} steps ({f:g}x)": n for f, n in every.items()}
    runs = {"paced": [paced], **{name: [] for name in fixed}}
    names = list(runs)
    for repeat in range(args.repeats):
        order = names[repeat % len(names):] + names[:repeat % len(names)]  # rotated
        for name in order:
            if repeat == 0 and name == "paced":
                continue  # ran first, for the cost
            if name == "paced":
                runs[name].append(run_once("paced", args, root, faults=False, extra=extra))
            else:
                runs[name].append(run_once("sync", args, root, faults=False,
                                           every=fixed[name], extra=extra))
    later = []
    for i, row in enumerate(runs["paced"]):
        for attempt, gaps in sorted(chosen_intervals(read(row["run_dir"])).items()):
            shown = ", ".join(f"{g:.2f}" for g in gaps) or "-"
            ratio = f" ({statistics.mean(gaps) / optimum:.2f}x the optimum)" if gaps else ""
            print(f"  paced run {i + 1}, attempt {attempt}: intervals kept {shown} s{ratio}",
                  flush=True)
            later += gaps if attempt >= 1 else []
    medians = {}
    for name, rows in runs.items():
        cells = []
        for row in rows:
            g = row.get("product")
            ended = " DID NOT FINISH" if row.get("failed") else ""
            cells.append(f"{row['ettr']:.3f} (product {'-' if g is None else f'{g.ratio:.3f}'},"
                         f" wall {row['wall_s']:.0f} s, kills {len(row['fault_costs_s'])}{ended})")
        medians[name] = statistics.median(r["ettr"] for r in rows)
        print(f"{name:26s} ETTR median {medians[name]:.3f}: " + "; ".join(cells), flush=True)
    if later:
        mean = statistics.mean(later)
        print(f"chosen interval (attempts >= 1) {mean:.2f} s = {mean / optimum:.2f}x Daly's "
              f"optimum: {'within' if abs(mean / optimum - 1) <= 0.2 else 'NOT within'} 20%")
    else:
        print("chosen interval: no two commits in an attempt after the first failure")
    best = max((m, n) for n, m in medians.items() if n != "paced")
    verdict = "at least" if medians["paced"] >= best[0] else "below"
    print(f"paced goodput (median of {len(runs['paced'])}) {medians['paced']:.3f} is {verdict} "
          f"the best fixed interval's ({best[1]}: {best[0]:.3f})")
