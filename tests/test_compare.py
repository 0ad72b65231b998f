"""``cosparse compare`` on the Criteo sample: both variants train on the same data, order and
seed; compare.json holds both runs' figures and report.html is parsed back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from exactness import CRITEO
from test_report import parse

from cosparse.cli import main
from cosparse.config import ConfigError, switch_preset
from cosparse.report.compare import parse_variant
from cosparse.report.html import SECTION_IDS

CONFIG = Path(__file__).resolve().parents[1] / "configs/criteo_ab.yaml"


def test_variants_switch_the_architecture_and_keep_the_capacities():
    raw = {"preset": "arch-b", "store": {"device": {"rows": 10}, "host": {"rows": 20}},
           "supply": {"path": "collaborative", "lookahead": 4, "horizon": 2}}
    a = switch_preset(raw, *parse_variant("arch-a"))
    assert a["supply"]["path"] == "ps-direct" and a["supply"]["lookahead"] == 1
    assert "host" not in a["store"] and a["store"]["device"]["rows"] == 10
    assert a["preset"] == "arch-a" and a["supply"]["horizon"] == 2  # not a preset switch: kept
    step = switch_preset(raw, *parse_variant("arch-b,supply.path=ps-tiered,supply.lookahead=1"))
    assert step["supply"] == {"path": "ps-tiered", "lookahead": 1, "horizon": 2}
    assert step["store"]["host"]["spill_to"] == "remote" and step["store"]["host"]["rows"] == 20
    # the config's own switches give way to the variant's preset, the variant's keys to nobody
    own = {"store": {"device": {"rows": 10, "policy": "lru"}}, "supply": {"fallback": "ps-direct"}}
    assert switch_preset(own, "arch-a")["store"]["device"]["policy"] == "hotness"
    assert "fallback" not in switch_preset(own, "resident")["supply"]
    pinned = switch_preset(own, *parse_variant("arch-a,store.device.policy=lfu"))
    assert pinned["store"]["device"]["policy"] == "lfu"
    with pytest.raises(ConfigError, match="not a preset"):
        parse_variant("arch-c")
    with pytest.raises(ConfigError, match="key=value"):
        parse_variant("arch-b,supply.path")


@pytest.mark.skipif(not CRITEO.exists(), reason="../shared/data/criteo is not present")
def test_compare_writes_both_runs_and_a_report(tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main(["compare", "--config", str(CONFIG), "--steps", "12", "--warmup", "2",
               "--data", str(CRITEO), "--out", str(out)])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["loss_identical"] is True
    result = json.loads((out / "compare.json").read_text())
    a, b = result["runs"]["a"], result["runs"]["b"]
    assert a["preset"] == "arch-a" and b["preset"] == "arch-b"
    assert len(a["losses"]) == len(b["losses"]) == 12 and a["losses"] == b["losses"]
    assert a["auc"] == b["auc"] and 0.5 < a["auc"] < 1.0
    # B's trainer pulls less from the PS than A's: the workers bring its cold rows
    assert b["bytes_per_step"]["trainer_ps.pull"] < a["bytes_per_step"]["trainer_ps.pull"]
    assert b["bytes_per_step"]["worker_ps"] > 0 and a["bytes_per_step"]["worker_ps"] is None
    assert b["bytes_per_step"]["worker_trainer"] > a["bytes_per_step"]["worker_trainer"] > 0
    for run in (a, b):
        assert run["samples_per_s"] > 0 and run["step_ms_p99"] >= run["step_ms_p50"] > 0
        assert run["host"]["cpu_util"] > 0 and run["host"]["rss_bytes"] > 0
        assert run["measured_steps"] == 10 and 0 < run["hbm_share"] <= 1
    assert b["hit_rate"]["host"] is not None and b["miss_sources"]["delivered"] > 0
    doc = parse((out / "report.html").read_text())
    assert not doc.errors
    assert set(SECTION_IDS) <= set(doc.section_ids)
    assert "bit-identical" in doc.section_text("loss")
    # each run's slowest steps, explained (cosparse explain on its step records)
    for run in (a, b):
        assert run["slow_steps"]["steps"] == 12 and run["slow_steps"]["slow"]
    assert "Slow steps" in (out / "report.html").read_text()
    assert "slow_steps" in doc.section_ids


def test_an_older_compare_json_is_rendered_with_its_stages_renamed_and_says_so(tmp_path, capsys):
    """A format-1 compare.json (before the stage renames) still renders: its 'supply' stage is
    shown as 'gather', and a line on stderr says so; a file that is not one is refused."""
    import json

    from cosparse.cli import main

    run = {"label": "a", "losses": [0.7, 0.6], "stage_ms": {"read": 1.0, "supply": 2.5}}
    old = tmp_path / "compare.json"
    old.write_text(json.dumps({"steps": 2, "runs": {"a": run, "b": dict(run, label="b")}}))
    assert main(["report", str(old)]) == 0
    err = capsys.readouterr().err
    assert "older compare.json (format 1" in err and "'supply'" in err and "'gather'" in err
    html = (tmp_path / "report.html").read_text()
    assert "gather (ms)" in html and "supply" not in html
    (tmp_path / "other.json").write_text("[1, 2]")
    assert main(["report", str(tmp_path / "other.json")]) == 2
    assert "not a compare.json" in capsys.readouterr().err
