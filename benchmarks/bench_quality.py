"""Model quality against the libraries a team would pick instead (issue 36): per model family,
cosparse's model and the peer's same model with the same hyperparameters, on the same data and
split, over several seeds, in one run.

Families (``--family``, default all that are built):

* ``retrieval``: cosparse's two-tower (``configs/movielens_two_tower.yaml``) against
  torch-rechub 0.9.0's ``DSSM`` towers trained with the same loss, on MovieLens-100k,
  leave-last-out, the whole corpus ranked (``benchmarks/quality_retrieval.py``,
  ``benchmarks/peer_rechub_retrieval.py``); recall@10 against popularity's too.
* ``sequence``: cosparse's SASRec (``configs/beauty_sasrec.yaml``) against RecBole 1.2.1's
  ``SASRec`` (full-softmax cross-entropy, its default) with the same layers and hyperparameters,
  on Amazon Beauty (the S3-Rec file), leave-one-out, the whole corpus ranked
  (``benchmarks/quality_sequence.py``, ``benchmarks/peer_recbole_sasrec.py``); set beside the
  figure a paper publishes for that protocol (``PUBLISHED``).
* ``multitask``: cosparse's MMoE (``configs/taobao_mmoe.yaml``, every table at dim 16) against
  torch-rechub 0.9.0's ``MMOE`` on the Taobao UserBehavior log, tasks click / cart_fav / buy
  (``benchmarks/quality_multitask.py``, ``benchmarks/peer_rechub.py``). Also: the same towers
  trained one task at a time, and cosparse's run on the tiered and collaborative placements,
  which must equal the resident run bit for bit.

Per family the JSON has ``ours`` and ``peer`` (each task's AUC and their mean, or the ranking
metrics; samples/s; per seed), ``diff`` (ours - peer, paired by seed, averaged over seeds: the
mean AUC over tasks, or recall@10),
``diff_se`` (its standard error over the seeds) and ``speed_over_peer`` (training samples/s,
ours over the peer's, medians over seeds). The peer runs in ``.venv-quality`` (``make peers``);
without it the peer's figures are null, with the reason.

``--quick`` (under 60 s): 2 seeds of 40 steps per family (sequence: one epoch over the first
500 users' lines, for both), one placement; the full run: 3 seeds of a whole run (multitask: one
epoch, 261 steps; retrieval and sequence: the config's 5 epochs) and both placements
(sequence: over one epoch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common, quality_multitask, quality_retrieval, quality_sequence

QUALITY_VENV = common.REPO / ".venv-quality"
FAMILIES = ("multitask", "retrieval", "sequence")
RANKING = ("recall@10", "ndcg@10", "mrr")
BASELINES = ("recall@10.popularity", "recall@10.transitions")  # (ours: ranked in the same run)
QUALITY_GOAL = 0.98  # retrieval: recall@10 and NDCG@10 at least this times the peer's
POPULARITY_GOAL = 2.0  # retrieval: recall@10 at least this times popularity's
# training samples/s over the peer's, at least; never loosen (issue 36's goal)
SPEED_GOAL = 1.5


def mean_auc(auc: dict[str, float]) -> float:
    return statistics.fmean(auc.values())


def se(values: list[float]) -> float:
    """The standard error of the mean of ``values`` (0 for one value)."""
    return statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0


def run_peer(family: str, args: list[str], timeout_s: float) -> tuple[list[dict] | None, str]:
    """The peer's JSON lines (one per seed) from .venv-quality, or None and why not."""
    python = QUALITY_VENV / "bin/python"
    if not python.exists():
        return None, f"{QUALITY_VENV.name} is absent: run `make peers`"
    cmd = [str(python), "-m", "benchmarks.peer_rechub", "--family", family, *args]
    try:
        done = subprocess.run(cmd, cwd=common.REPO, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"the peer ran past {timeout_s:.0f} s"
    if done.returncode != 0:
        return None, f"the peer failed (exit {done.returncode}): {done.stderr[-1500:]}"
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")], ""


def seed_runs(family: str, module: Any, steps: int | None, seeds: list[int]
              ) -> list[dict[str, Any]]:
    """cosparse's run of each seed (``module``: the family's ``quality_*``): its metrics (each
    task's ``auc``, or the ranking ones) and its training samples/s."""
    runs = []
    for seed in seeds:
        got = module.train(module.mapping(steps, seed))
        metrics = {"auc": got["auc"]} if got["auc"] else got["ranking"]
        print(f"{family}: cosparse seed {seed}: {metrics} {got['samples_per_s']:.0f} samples/s",
              flush=True)
        runs.append({"seed": seed, **metrics, "samples_per_s": got["samples_per_s"]})
    return runs


def speed(ours: list[dict[str, Any]], peer: list[dict[str, Any]]) -> float:
    """Training samples/s, ours over the peer's (medians over seeds)."""
    return (statistics.median(o["samples_per_s"] for o in ours)
            / statistics.median(p["samples_per_s"] for p in peer))


def multitask(steps: int, seeds: list[int]) -> dict[str, Any]:
    q = quality_multitask
    ours = seed_runs("multitask", q, steps, seeds)
    raw = q.mapping(steps, seeds[0])
    single = {t: q.train(q.one_task(raw, t))["auc"][t] for t in raw["objective"]["tasks"]}
    print(f"multitask: one task at a time: {single}", flush=True)
    full = steps == q.epoch_steps()
    placements = q.placements_equal(raw, ("tiered", "collaborative") if full else ("tiered",))
    print(f"multitask: placements equal to resident: {placements}", flush=True)
    with tempfile.TemporaryDirectory(prefix="cosparse-quality-") as tmp:
        data = Path(tmp) / "samples.npz"
        vocab = q.export_samples(raw, data)
        peer, why = run_peer("multitask", ["--data", str(data), "--vocab", json.dumps(vocab),
                                           "--seeds", ",".join(map(str, seeds))],
                             timeout_s=1200 if full else 300)
    out: dict[str, Any] = {
        "data": "taobao-userbehavior/UserBehavior_head84k.csv, last 20% of events evaluate",
        "steps": steps, "seeds": seeds,
        "ours": {"runs": ours, "mean_auc": statistics.fmean(mean_auc(r["auc"]) for r in ours)},
        "single_task": {"auc": single, "mean_auc": mean_auc(single),
                        "mmoe_mean_auc_same_seed": mean_auc(ours[0]["auc"])},
        "placements_equal_resident": placements, "peer": None, "peer_why": why or None,
        "diff": None, "diff_se": None, "speed_over_peer": None}
    if peer is not None:
        diffs = [mean_auc(o["auc"]) - mean_auc(p["auc"]) for o, p in zip(ours, peer, strict=True)]
        out["peer"] = {"library": "torch-rechub 0.9.0 MMOE", "runs": peer,
                       "mean_auc": statistics.fmean(mean_auc(p["auc"]) for p in peer)}
        out["diff"] = statistics.fmean(diffs)
        out["diff_se"] = se(diffs)
        out["speed_over_peer"] = speed(ours, peer)
    return out


def retrieval(steps: int | None, seeds: list[int]) -> dict[str, Any]:
    """The two-tower against torch-rechub's DSSM on MovieLens-100k (``steps`` None: the
    config's epochs)."""
    q = quality_retrieval
    ours = seed_runs("retrieval", q, steps, seeds)
    raw = q.mapping(steps, seeds[0])
    names = ("tiered",) if steps else ("tiered", "collaborative")
    placements = q.placements_equal(raw, names, steps or q.epoch_steps())
    print(f"retrieval: placements equal to resident: {placements}", flush=True)
    batch, epochs = raw["data"]["batch_size"], raw["train"]["epochs"]
    with tempfile.TemporaryDirectory(prefix="cosparse-quality-") as tmp:
        data = Path(tmp) / "samples.npz"
        vocab = q.export_samples(raw, data, steps * batch if steps else None)
        peer, why = run_peer("retrieval", ["--data", str(data), "--vocab", json.dumps(vocab),
                                           "--seeds", ",".join(map(str, seeds)),
                                           "--epochs", str(1 if steps else epochs)],
                             timeout_s=300 if steps else 1500)
    out: dict[str, Any] = {
        "data": "movielens-100k/u.data, leave-last-out, the whole corpus ranked",
        "steps": steps or f"{epochs} epochs", "seeds": seeds,
        "ours": {"runs": ours, **{m: statistics.fmean(r[m] for r in ours)
                                  for m in (*RANKING, *BASELINES)}},
        "placements_equal_resident": placements, "peer": None, "peer_why": why or None,
        "diff": None, "diff_se": None, "speed_over_peer": None}
    if peer is not None:
        diffs = [o["recall@10"] - p["recall@10"] for o, p in zip(ours, peer, strict=True)]
        out["peer"] = {"library": "torch-rechub 0.9.0 DSSM", "runs": peer,
                       **{m: statistics.fmean(p[m] for p in peer) for m in RANKING}}
        out["diff"] = statistics.fmean(diffs)  # (recall@10)
        out["diff_se"] = se(diffs)
        out["speed_over_peer"] = speed(ours, peer)
    return out


def sequence(size: str, seeds: list[int]) -> dict[str, Any]:
    """SASRec against RecBole's on Amazon Beauty; ``size``: ``full`` (the config's epochs over
    every user), ``quick`` or ``tiny`` (one epoch over the first users' lines)."""
    q = quality_sequence
    with tempfile.TemporaryDirectory(prefix="cosparse-quality-") as tmp:
        users = {"full": None, "quick": q.QUICK_USERS, "tiny": q.QUICK_USERS // 4}[size]
        path = q.BEAUTY if users is None else q.subset(Path(tmp) / "beauty.txt", users)
        epochs = q.config_epochs() if size == "full" else 1
        ours = []
        for seed in seeds:
            got = q.train(q.mapping(path, epochs, seed))
            print(f"sequence: cosparse seed {seed}: {got['ranking']} "
                  f"{got['samples_per_s']:.0f} samples/s", flush=True)
            ours.append({"seed": seed, **got["ranking"], "samples_per_s": got["samples_per_s"]})
        raw = q.mapping(path, epochs, seeds[0])
        steps = q.epoch_steps(raw)  # (the placements: one epoch, bit for bit)
        names = ("tiered", "collaborative") if size == "full" else ("tiered",)
        placements = q.placements_equal({**raw, "train": {**raw["train"], "steps": steps,
                                                          "epochs": None}}, names)
        print(f"sequence: placements equal to resident over {steps} steps: {placements}",
              flush=True)
        peer, why = (None, f"{QUALITY_VENV.name} is absent: run `make peers`")
        if (QUALITY_VENV / "bin/python").exists():
            peer, why = q.run_peer(QUALITY_VENV / "bin/python", raw, seeds,
                                   timeout_s=7200 if size == "full" else 300)
    out: dict[str, Any] = {
        "data": "seqrec-s3rec/Beauty.txt, leave-one-out, the whole corpus ranked"
                + ("" if users is None else f" (the first {users} users)"),
        "epochs": epochs, "seeds": seeds, "placement_steps": steps,
        "ours": {"runs": ours, **{m: statistics.fmean(r[m] for r in ours)
                                  for m in (*RANKING, *BASELINES)}},
        "published": q.PUBLISHED,
        "placements_equal_resident": placements, "peer": None, "peer_why": why or None,
        "diff": None, "diff_se": None, "speed_over_peer": None}
    if peer is not None:
        diffs = [o["recall@10"] - p["recall@10"] for o, p in zip(ours, peer, strict=True)]
        out["peer"] = {"library": peer[0]["peer"], "runs": peer,
                       **{m: statistics.fmean(p[m] for p in peer) for m in RANKING if m in
                          peer[0]}}
        out["diff"] = statistics.fmean(diffs)  # (recall@10)
        out["diff_se"] = se(diffs)
        out["speed_over_peer"] = speed(ours, peer)
    return out


def targets(fam: str, res: dict[str, Any]) -> list[str]:
    """The TARGET lines of a family's goals."""
    lines = []
    if res["diff"] is None:
        lines.append(f"TARGET {fam} against the peer: not measured ({res['peer_why']})")
    elif fam in ("retrieval", "sequence"):
        for m in ("recall@10", "ndcg@10"):
            ratio = res["ours"][m] / res["peer"][m]
            lines.append(f"TARGET {fam}.{m} over the peer's {ratio:.3f} >= {QUALITY_GOAL}: "
                         f"{'PASS' if ratio >= QUALITY_GOAL else 'MISS'}")
    else:
        ok = res["diff"] >= -res["diff_se"]
        lines.append(f"TARGET {fam}.diff {res['diff']:+.4f} >= -diff_se ({res['diff_se']:.4f}): "
                     f"{'PASS' if ok else 'MISS'}")
    if res["diff"] is not None:
        ok = res["speed_over_peer"] >= SPEED_GOAL
        lines.append(f"TARGET {fam}.speed_over_peer {res['speed_over_peer']:.2f} >= {SPEED_GOAL}:"
                     f" {'PASS' if ok else 'MISS'}")
    if fam == "retrieval":
        ratio = res["ours"]["recall@10"] / res["ours"]["recall@10.popularity"]
        lines.append(f"TARGET retrieval recall@10 over popularity's {ratio:.2f} >= "
                     f"{POPULARITY_GOAL}: {'PASS' if ratio >= POPULARITY_GOAL else 'MISS'}")
    elif fam == "multitask":
        s = res["single_task"]
        ok = s["mmoe_mean_auc_same_seed"] >= s["mean_auc"]
        lines.append(f"TARGET multitask mean AUC {s['mmoe_mean_auc_same_seed']:.4f} >= one task "
                     f"at a time {s['mean_auc']:.4f}: {'PASS' if ok else 'MISS'}")
    equal = all(res["placements_equal_resident"].values())
    lines.append(f"TARGET {fam} placements equal resident: {'PASS' if equal else 'MISS'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 seeds of 40 steps: < 60 s")
    ap.add_argument("--tiny", action="store_true", help="smoke-test size: 2 seeds of 8 steps")
    ap.add_argument("--family", choices=FAMILIES, action="append",
                    help="a family to run (repeatable; default: all)")
    ap.add_argument("--seeds", type=int, help="seeds per family (default 3, quick 2)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    seeds = list(range(a.seeds or (2 if a.quick or a.tiny else 3)))
    steps = 8 if a.tiny else 40 if a.quick else None
    t0 = time.perf_counter()
    out: dict[str, Any] = {"quick": a.quick, "tiny": a.tiny, "machine": common.machine_info()}
    size = "tiny" if a.tiny else "quick" if a.quick else "full"
    for fam in a.family or FAMILIES:
        out[fam] = (multitask(steps or quality_multitask.epoch_steps(), seeds)
                    if fam == "multitask" else retrieval(steps, seeds) if fam == "retrieval"
                    else sequence(size, seeds))
        for line in targets(fam, out[fam]):
            print(line)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(f"wall {out['wall_s']} s")
    if a.json:
        common.write_json(a.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
