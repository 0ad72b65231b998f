"""The live tuning agent (``train.autotune``): during a real run it changes one live knob at a
time between intervals, chosen from the run's own counters, and keeps a change only if the next
window's steady-state throughput beats the window before it beyond noise; otherwise it rolls the
change back.

- A window is ``train.autotune.every`` steps: its interval records, less the first one after a
  change (the data stream and planner restart in it: not steady state).
- "Beyond noise" is a one-sided Mann-Whitney U test of the two windows' interval throughputs
  (scipy) at p < 0.1, and a median gain over ``min_gain``.
- After ``patience`` changes in a row rolled back, it settles: each trial costs the run a window
  at a slower setting, and a run whose counters argue for nothing that pays should not keep
  paying for it. Settled, it compares every window with the first one measured since; two in
  a row slower beyond noise (the same test, so a false alarm, which costs trials, is rare)
  mean the run drifted, and it explores again with a clean slate.
- Every proposal passes the shared feasibility check (``cosparse.autotune.feasible``: the
  config's validation, the host tier at least the device tier's rows, the budgets) before it
  is applied; one that fails is skipped, the next best tried, and the refusal journaled (a
  pruned trial with its reason). A resized tier's largest rung is the largest that passes.
- Every change, kept or rolled back, is an Optuna trial in a ``JournalStorage`` log (the offline
  agent's audit format: the knobs, both windows, the verdict, the code version, the config hash,
  who applied it), and each change reaches the run's metrics as a ``reconfigure`` record.
- It reaches the trainer only through ``Trainer(on_interval=...)``: it answers an interval with
  a ``Reconfigure``. The live knobs are exact, so the run trains the numbers it would without it.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from scipy.stats import mannwhitneyu

from cosparse.autotune.audit import code_version, config_hash
from cosparse.autotune.feasible import live_refusal
from cosparse.autotune.types import Budgets
from cosparse.config import Config
from cosparse.config.sizes import parse_bytes
from cosparse.config.train import LIVE_PATHS
from cosparse.train.live import Reconfigure
from cosparse.tune.tiers import row_bytes

STUDY = "cosparse-live"
APPLIED_BY = "live agent (train.autotune)"
# the values each live knob steps through, one rung at a time
LADDERS: dict[str, tuple[int, ...]] = {
    "supply.lookahead": (0, 1, 2, 4, 8),
    "supply.horizon": (0, 2, 8),
    "data.workers": (0, 1, 2, 4),
    "data.queue_depth": (1, 2, 4, 8),
    "supply.publish_every": (1, 2, 4, 8),
}
P_VALUE = 0.1
DRIFT_WINDOWS = 2  # slower windows in a row that wake a settled agent
SIZES = ("store.device.rows", "store.host.rows")  # their ladders come from the budgets


def _value(cfg: Config, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node if key == "supply.path" else int(node)


def _size_ladder(cfg: Config, key: str) -> tuple[int, ...]:
    """A tier's rows doubled from the start's up to what its byte budget holds (every table
    takes ``rows``, each at its own row width)."""
    tier = key.split(".")[1]
    budget = getattr(cfg.train.autotune, f"{tier}_budget")
    per_row = sum(row_bytes(t) for t in cfg.tables)
    most = parse_bytes(budget, f"train.autotune.{tier}_budget") // per_row
    start = _value(cfg, key)
    return tuple(r for r in (start * 2**i for i in range(12)) if r <= max(most, start))


def _budget(value: int | str | None, tier: str) -> int | None:
    return None if value is None else parse_bytes(value, f"train.autotune.{tier}_budget")


def _mean(recs: list[dict[str, Any]], key: str) -> float:
    return statistics.fmean(float(r.get(key) or 0.0) for r in recs) if recs else 0.0


@dataclasses.dataclass(frozen=True)
class Move:
    """One candidate change and the counter that argues for it (its milliseconds per step)."""

    key: str
    value: int | str
    score: float
    reason: str


def journal_path(cfg: Config) -> Path:
    """``train.autotune.journal``, else beside ``train.metrics_json``, else in this directory."""
    at = cfg.train.autotune
    if at.journal:
        return Path(at.journal)
    if cfg.train.metrics_json:
        return Path(cfg.train.metrics_json).with_suffix(".autotune.log")
    return Path("autotune-journal.log")


class LiveAgent:
    """``Trainer(on_interval=LiveAgent(cfg, journal))``: see the module docstring."""

    def __init__(self, cfg: Config, journal: Path, log: Callable[[str], None] = print) -> None:
        at = cfg.train.autotune
        self.knobs = list(at.knobs)
        self.per_window = at.every // cfg.train.log_every
        self.log_every = cfg.train.log_every
        self.min_gain = at.min_gain
        self.patience = at.patience
        self.log = log
        self.current = {k: _value(cfg, k) for k in self.knobs}
        self.start = copy.deepcopy(cfg)  # (what the feasibility check sets the knobs on)
        self.budgets = Budgets(device_bytes=_budget(at.device_budget, "device"),
                               host_bytes=_budget(at.host_budget, "host"))
        self.ladders = {k: _size_ladder(cfg, k) if k in SIZES else LIVE_PATHS
                        if k == "supply.path" else tuple(sorted({*LADDERS[k], self.current[k]}))
                        for k in self.knobs}
        self.cores = len(os.sched_getaffinity(0))
        self.workers = cfg.data.workers  # (processes on this host, besides the trainer)
        self.shards = cfg.store.remote.num_shards if cfg.store.remote.embedded else 0
        self.base: list[float] | None = None  # the window before the change under trial
        self.span: tuple[int, int] = (0, 0)  # the steps the last window measured, first and last
        self.base_span: tuple[int, int] = (0, 0)
        self.trying: Move | None = None
        self.old: int | str | None = None
        self.tabu: set[tuple[str, int | str]] = set()
        self.window: list[float] = []
        self.recs: list[dict[str, Any]] = []
        self.skip = 0  # intervals left to drop (the restart after a change)
        self.target = self.per_window  # intervals the current window measures
        self.intervals = 0
        self.fallbacks = 0
        self.filling: str | None = None  # the tier resized last, until it evicts again
        self.fill_left = 0
        self.settled = False
        self.rollbacks = 0  # in a row
        self.reference: list[float] | None = None  # the first window measured once settled
        self.drifting = 0  # windows in a row slower than the reference
        journal.parent.mkdir(parents=True, exist_ok=True)
        self.study = optuna.create_study(
            study_name=STUDY, direction="maximize", load_if_exists=True,
            storage=JournalStorage(JournalFileBackend(str(journal))))
        self.study.set_user_attr("code", code_version())
        self.study.set_user_attr("start", dict(self.current))
        self.config_hash = config_hash(dataclasses.asdict(cfg))
        self.changes: list[dict[str, Any]] = []  # what it did, in order (kept or rolled back)
        self.refused: list[dict[str, Any]] = []  # proposals the feasibility check refused
        # the run's first window starts the stream and fills the tiers: not steady state
        self.skip = self.per_window

    # --- the trainer's callback -------------------------------------------------------------
    def __call__(self, rec: dict[str, Any]) -> Reconfigure | None:
        self.intervals += 1
        fallbacks = int(rec.get("fallbacks") or 0)
        if fallbacks > self.fallbacks:  # the supply path changed under the windows
            self.fallbacks = fallbacks
            if "supply.path" in self.knobs:  # the workers' rows do not start again
                self.knobs.remove("supply.path")
            return self._fell_back(int(rec["step"]))
        if self.skip:
            self.skip -= 1
            return None
        if self.filling is not None and self.fill_left > 0 and not rec.get(
                f"evictions.{self.filling}"):
            self.fill_left -= 1  # a resized tier still has free slots: not steady state yet
            return None
        self.filling = None
        self.window.append(float(rec["samples_per_s"]))
        self.recs.append(rec)
        if len(self.window) < self.target:
            return None
        window, recs = self.window, self.recs
        self.window, self.recs = [], []
        self.target = self.per_window
        step = int(rec["step"])
        self.span = (int(recs[0]["step"]) - self.log_every + 1, step)
        if self.trying is not None:
            answer = self._judge(window, step)
            if answer is not None:
                return answer
        elif self.settled and not self._drifted(window, step):
            return None
        else:
            self.base, self.base_span = window, self.span
        return self._propose(recs, step)

    def _drifted(self, window: list[float], step: int) -> bool:
        """Settled: is this window slower than the reference beyond noise? Then explore again,
        every move allowed anew (what was slower before may not be now)."""
        if self.reference is None:
            self.reference = window
            return False
        ratio = statistics.median(window) / statistics.median(self.reference)
        p = float(mannwhitneyu(window, self.reference, alternative="less").pvalue)
        slower = p < P_VALUE and ratio < 1.0 - self.min_gain
        self.drifting = self.drifting + 1 if slower else 0
        if self.drifting < DRIFT_WINDOWS:
            return False
        self.log(f"autotune: step {step}: throughput drifted to {ratio:.3f}x the settled window "
                 f"(p = {p:.3f}, {self.drifting} windows in a row); exploring again")
        self._wake()
        return True

    def _wake(self) -> None:
        self.settled, self.reference, self.rollbacks, self.drifting = False, None, 0, 0
        self.tabu.clear()

    def _fell_back(self, step: int) -> Reconfigure | None:
        """A fallback (B's supply to the trainer's own pulls) makes the windows around it
        incomparable: measure afresh, and undo a change under trial."""
        self.window, self.recs, self.base = [], [], None
        self._wake()
        self._restart()
        move, old = self.trying, self.old
        self.log(f"autotune: the supply fell back at step {step}; measuring again")
        if move is None or old is None:
            return None
        self._journal(move, old, [], [], 0.0, 1.0, False, step)
        self.trying = self.old = None
        return Reconfigure({move.key: old}, "rolled back: the supply fell back during its "
                                            "window", APPLIED_BY)

    # --- deciding ---------------------------------------------------------------------------
    def _judge(self, window: list[float], step: int) -> Reconfigure | None:
        """Keep the change under trial (None: go on proposing) or roll it back."""
        move, old, base = self.trying, self.old, self.base
        assert move is not None and old is not None and base is not None
        gain = statistics.median(window) / statistics.median(base)
        p = float(mannwhitneyu(window, base, alternative="greater").pvalue)
        kept = p < P_VALUE and gain > 1.0 + self.min_gain
        self._journal(move, old, base, window, gain, p, kept, step)
        self.trying = self.old = None
        verdict = (f"{move.key} {old} -> {move.value}: {gain:.3f}x the window before "
                   f"(p = {p:.3f})")
        if kept:
            self.rollbacks = 0
            self.current[move.key] = move.value
            self.tabu.add((move.key, old))  # just measured slower: no going back to it
            self.base = window
            self.base_span = self.span
            self.log(f"autotune: kept {verdict}")
            return None
        self.tabu.add((move.key, move.value))
        self.base = None  # measured again after the rollback
        self._restart(move.key)
        self.log(f"autotune: rolled back {verdict}")
        self.rollbacks += 1
        if self.patience and self.rollbacks >= self.patience:
            self._settle(step, f"{self.rollbacks} changes in a row rolled back")
        return Reconfigure({move.key: old}, f"rolled back: {verdict}", APPLIED_BY)

    def _propose(self, recs: list[dict[str, Any]], step: int) -> Reconfigure | None:
        moves = sorted((m for m in self._moves(recs) if (m.key, m.value) not in self.tabu),
                       key=lambda m: -m.score)
        move = next((m for m in moves if self._feasible(m, step)), None)
        if move is None:
            self._settle(step, "no feasible move left that the counters argue for")
            self.reference = self.base  # (measured at the settled knobs)
            return None
        self.trying, self.old = move, self.current[move.key]
        self._restart(move.key)
        return Reconfigure({move.key: move.value}, move.reason, APPLIED_BY)

    def _settle(self, step: int, why: str) -> None:
        self.settled, self.reference, self.drifting = True, None, 0
        self.log(f"autotune: settled at step {step} ({why}): {self.current}")

    def _restart(self, key: str | None = None) -> None:
        """The change restarts the stream: its first interval is not steady state. A resized
        tier is not either until it evicts again (full): until then, up to two windows of
        intervals are not measured (a tier with free slots evicts nothing, so it is fast for a
        while whether or not its size pays at steady state)."""
        self.skip, self.target = 1, self.per_window - 1
        if key in SIZES:
            self.filling, self.fill_left = key.split(".")[1], 2 * self.per_window

    def _moves(self, recs: list[dict[str, Any]]) -> list[Move]:
        """Each knob's next rung up and down, scored by the stage time it would relieve."""
        wait = _mean(recs, "stage_ms.read")  # the trainer waiting for the next prepared batch
        plan = _mean(recs, "stage_ms.plan") + _mean(recs, "stage_ms.fill")
        featurize = _mean(recs, "stage_ms.featurize")
        step = max(_mean(recs, "step_ms_p50"), 1e-3)
        shrinks = _mean(recs, "lookahead_shrinks")
        hit = _mean(recs, "hit_rate.device")
        below = 1.0 - _mean(recs, "miss_share.host")  # device misses the host did not serve
        la = self.current.get("supply.lookahead")
        # B's workers bring rows on other processes, which pays only on cores that are free
        busy = (1 + self.current.get("data.workers", self.workers) + self.shards) / self.cores
        delivered, pulled = _mean(recs, "miss_share.delivered"), _mean(recs, "miss_share.trainer_ps")
        up = {"supply.lookahead": (plan if la == 0 else wait,
                                   f"planning {plan:.1f} ms and waiting {wait:.1f} ms a step"),
              "data.workers": (featurize + wait, f"featurizing {featurize:.1f} ms and waiting "
                                                 f"{wait:.1f} ms a step"),
              "data.queue_depth": (wait / 2, f"waiting {wait:.1f} ms a step for batches"),
              "supply.horizon": (plan * (1.0 - hit) / 2,
                                 f"device hit rate {hit:.2f}, planning {plan:.1f} ms a step"),
              "supply.publish_every": (0.05 * step, "publishing the filter less often frees "
                                                    "CPU for the step"),
              "store.device.rows": (plan * (1.0 - hit), f"device hit rate {hit:.2f}, filling "
                                                         f"{plan:.1f} ms a step"),
              "store.host.rows": (plan * (1.0 - hit) * below,
                                  f"{below:.2f} of the device misses come from below the host, "
                                  f"filling {plan:.1f} ms a step"),
              "supply.path": (plan * delivered * busy,
                              f"the workers bring {delivered:.2f} of the misses with "
                              f"{busy * self.cores:.0f} processes on {self.cores} cores, "
                              f"planning {plan:.1f} ms a step")}
        down = {"supply.lookahead": (shrinks * step, f"{shrinks:.1f} lookahead shrinks a "
                                                     "interval"),
                "data.workers": (0.05 * step if self.current.get("data.workers", 0)
                                 >= self.cores else 0.0, "more workers than cores"),
                "supply.horizon": (shrinks * step / 2, f"{shrinks:.1f} lookahead shrinks"),
                "supply.path": (plan * pulled / busy,
                                f"the trainer pulls {pulled:.2f} of the misses itself, "
                                f"planning {plan:.1f} ms a step")}
        out = []
        for key in self.knobs:
            if key == "supply.publish_every" and self.current.get("supply.path") == "ps-tiered":
                continue  # (no filter to publish)
            ladder, now = self.ladders[key], self.current[key]
            i = ladder.index(now)
            rungs = [(i + 1, up), (i - 1, down)]
            if key in SIZES:  # the largest feasible size first: a step of 2x may hide in noise
                top = max((j for j in range(i + 2, len(ladder))
                           if self._fits(key, ladder[j])), default=None)
                if top is not None:
                    rungs.insert(0, (top, up))
            for rank, (j, table) in enumerate(rungs):
                score, why = table.get(key, (0.0, ""))
                if 0 <= j < len(ladder) and score > 0:  # (_propose checks feasibility)
                    out.append(Move(key, ladder[j], score * (1.0 + 0.01 * (len(rungs) - rank)),
                                    why))
        return out

    def _fits(self, key: str, value: int | str) -> bool:
        """Whether the current knobs with ``key`` set to ``value`` pass the feasibility check."""
        return live_refusal(self.start, {**self.current, key: value}, self.budgets) is None

    def _feasible(self, move: Move, step: int) -> bool:
        """Whether ``move`` passes the feasibility check; a refusal is skipped for good (until
        the agent explores anew), logged and journaled with its reason."""
        params = {**self.current, move.key: move.value}
        why = live_refusal(self.start, params, self.budgets)
        if why is None:
            return True
        self.tabu.add((move.key, move.value))
        record = {"step": step, "knob": move.key, "from": self.current[move.key],
                  "to": move.value, "reason": move.reason, "refused": why, "params": params,
                  "config_hash": self.config_hash, "applied_by": APPLIED_BY,
                  **self.study.user_attrs["code"]}
        self.study.add_trial(optuna.trial.create_trial(
            params=params, state=optuna.trial.TrialState.PRUNED, user_attrs=record,
            distributions={k: CategoricalDistribution(list(self.ladders[k])) for k in params}))
        self.refused.append(record)
        self.log(f"autotune: step {step}: skipped {move.key} {record['from']} -> {move.value}, "
                 f"infeasible: {why}")
        return False

    def _journal(self, move: Move, old: int | str, base: list[float], window: list[float],
                 gain: float, p: float, kept: bool, step: int) -> None:
        params = {**self.current, move.key: move.value}
        record = {"step": step, "knob": move.key, "from": old, "to": move.value,
                  "reason": move.reason, "base_windows": base, "windows": window,
                  # the steps each window measured (none after a fallback's rollback)
                  "base_span": list(self.base_span) if base else None,
                  "span": list(self.span) if window else None,
                  "gain": gain, "p_value": p, "kept": kept, "params": params,
                  "config_hash": self.config_hash, "applied_by": APPLIED_BY,
                  **self.study.user_attrs["code"]}
        self.study.add_trial(optuna.trial.create_trial(
            params=params, value=gain, user_attrs=record,
            distributions={k: CategoricalDistribution(list(self.ladders[k])) for k in params}))
        self.changes.append(record)
