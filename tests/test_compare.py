"""``cosparse compare`` on the Criteo sample: both variants train on the same data, order and
seed; compare.json holds both runs' figures and report.html is parsed back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from exactness import CRITEO
from test_report import parse

from cosparse.cli import main
from cosparse.config import ConfigError
from cosparse.report.compare import parse_variant, variant_mapping
from cosparse.report.html import SECTION_IDS

CONFIG = Path(__file__).resolve().parents[1] / "configs/criteo_ab.yaml"


def test_variants_switch_the_architecture_and_keep_the_capacities():
    raw = {"preset": "arch-b", "store": {"device": {"rows": 10}, "host": {"rows": 20}},
           "supply": {"path": "collaborative", "lookahead": 4}}
    a = variant_mapping(raw, *parse_variant("arch-a"))
    assert a["supply"]["path"] == "ps-direct" and a["supply"]["lookahead"] == 1
    assert "host" not in a["store"] and a["store"]["device"]["rows"] == 10
    step = variant_mapping(raw, *parse_variant("arch-b,supply.path=resident,supply.lookahead=1"))
    assert step["supply"] == {"path": "resident", "lookahead": 1}
    assert step["store"]["host"]["spill_to"] == "remote" and step["store"]["host"]["rows"] == 20
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
