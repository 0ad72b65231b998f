"""The trainer's interval records: loss and throughput, link and tier counters (summed over ranks),
rank-to-rank traffic, health, and the log line of the limit that ended a run.

A role of ``cosparse.train.trainer.Trainer``, kept apart from its step loop.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from tqdm import tqdm

from cosparse import omp_wait, waits
from cosparse.store.tiered import TieredTable
from cosparse.train.metrics import IntervalCounters, IntervalStats, latency_figures
from cosparse.train.summary import RunSummary


class ReportingRole:
    """Interval metrics and log lines for ``Trainer``."""

    def _log_limit_reached(self, steps: int, epochs: int) -> None:
        """Given both ``train.steps`` and ``train.epochs``: which one ended the run."""
        st = self.state
        if st.step >= steps:
            self.log(f"train.steps ({steps}) reached at epoch {st.epoch + (st.batch_in_epoch > 0)}"
                     f" of train.epochs ({epochs}): the run ends at step {st.step}")
        elif st.epoch >= epochs:
            self.log(f"train.epochs ({epochs}) reached at step {st.step}, before train.steps "
                     f"({steps}): the run ends")

    def _cumulative(self) -> dict[str, Any]:
        """The run's counts so far (not deltas): bad records, skipped batches, features
        computed, distinct IDs per table."""
        out: dict[str, Any] = {"bad_records": self.bad_records,
                               "skipped_batches": self.skipped_batches}
        if self.cfg.features.spec and self.stream_factory is None:  # (a shared stream counts)
            out["features.computed"] = self.features_computed
        for name, n in self.ec.unique_ids.items():
            out[f"unique_ids.{name}"] = n
        return out

    def _counter_figures(self, counters: IntervalCounters, steps: int,
                         baseline: str) -> dict[str, Any]:
        """The link, supply and tier counters' change since ``counters`` last took them; on
        many ranks every link's bytes summed over the ranks, and the ranks' own link since
        ``baseline`` (``interval`` or ``run``)."""
        out: dict[str, Any] = counters.take(self.wire_bytes)
        if self.ranks:
            mine = {k: float(v or 0) for k, v in out.items() if k.startswith("bytes.")}
            everyone: list[Any] = [None] * self.ranks.world.size
            torch.distributed.all_gather_object(everyone, mine)  # (ranks hold other tables)
            totals: dict[str, float] = {}
            for theirs in everyone:
                for k, v in theirs.items():
                    totals[k] = totals.get(k, 0.0) + v
            out.update(totals)
            out.update(self._rank_rank(steps, baseline))
        return out

    def _log_interval(self, stats: IntervalStats, bar: tqdm | None) -> dict[str, Any]:
        rec = {"kind": "train", "step": self.state.step, **stats.summary(), **self._cumulative()}
        rec.update(self._counter_figures(self.interval_counters, stats.steps, "interval"))
        samples = {f"stage_ms.{k}": v for k, v in stats.stage_samples().items()}
        ps = {f"ps_ms.{k}": v for k, v in self.recorder.ps_latency_samples().items()}
        rec.update(latency_figures(ps))
        rec.update(self.health.judge(rec, self._cached()))
        self.sink.write(rec)
        self.sink.histograms("train", self.state.step, {**samples, **ps})
        if self.on_interval is not None:
            answer = self.on_interval(rec)
            if answer is not None and answer.changes:
                self._pending = answer
        if bar is not None:
            bar.set_postfix(loss=f"{rec['loss']:.4f}", samples_s=f"{rec['samples_per_s']:,.0f}")
            if bar.disable:
                self.log(
                    f"step {rec['step']}: loss {rec['loss']:.4f}, "
                    f"{rec['samples_per_s']:,.0f} samples/s"
                )
        stats.reset()
        return rec

    def _cached(self) -> dict[str, int]:
        """Each tiered table's device rows (the tables whose device hit rate means something)."""
        return {name: t.dev.limit for name, t in getattr(self.ec, "tables", {}).items()
                if isinstance(t, TieredTable)}

    def _comm_now(self) -> tuple[float, float]:
        """This rank's cumulative bytes sent to other ranks and time waited in collectives."""
        comm = self.ranks.world.comm  # type: ignore[union-attr]
        return float(comm["sent_bytes"]), float(comm["wait_ms"])

    def _rank_rank(self, steps: int, baseline: str) -> dict[str, float]:
        """Since ``baseline`` (the last interval, or the run's start): the bytes all ranks
        sent each other (summed over ranks), and the slowest rank's time in the collectives
        per step."""
        now = self._comm_now()
        seen = self._comm_seen.get(baseline, (0.0, 0.0))
        self._comm_seen[baseline] = now
        sent = torch.tensor([now[0] - seen[0]], dtype=torch.float64)
        torch.distributed.all_reduce(sent)
        wait = torch.tensor([now[1] - seen[1]], dtype=torch.float64)
        torch.distributed.all_reduce(wait, op=torch.distributed.ReduceOp.MAX)
        n = max(1, steps)
        return {"bytes.rank_rank": float(sent), "bytes.rank_rank_per_step": float(sent) / n,
                "collectives_ms_per_step": float(wait) / n}

    def _final_record(self, summary: RunSummary, run_counters: IntervalCounters,
                      last: dict[str, Any], evaluate: bool, waits0: Any,
                      step0: int) -> dict[str, Any]:
        """A run's final record, written to the metrics and returned: the whole run's figures
        and counters, the last interval's, the end-of-run evaluation (unless ``evaluate`` is
        False), the thread budget, and the blocking hand-offs per step since ``waits0``."""
        final = {**summary.figures(),
                 **self._counter_figures(run_counters, summary.steps, "run"),
                 **self._cumulative()}
        final["last_interval"] = {k: v for k, v in last.items() if k != "kind"} or None
        final.update(self._end_of_run_scores() if evaluate else {})
        final["step"] = self.state.step
        final["cpu"] = {**dataclasses.asdict(self.cpu),  # the thread budget the run trained under
                        **omp_wait.state()}
        # the hand-offs between its threads and processes that had to block, per step
        final["sync"] = waits.snapshot().since(waits0).per_step(self.state.step - step0)
        if self.ranks:
            final["world_size"] = self.ranks.world.size
        self.sink.write({**final, "kind": "final"})
        return final
