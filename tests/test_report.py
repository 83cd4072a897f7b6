"""report.md: the claims table shows rule, margin, n, estimate with its interval and post-hoc marks; only a smoke
(quick) config's report opens with the smoke-run line."""

import json

from collabalign.claims import non_inferiority, superiority
from collabalign.report import SMOKE_LINE, write_report
from collabalign.runs import RunDir


def make_run(path, smoke: bool):
    run = RunDir(path)
    run.write_config({"experiment": "toy", "smoke": smoke})
    claims = [superiority("A beats B", "A above B", post_hoc=True).decide([2.0, 3.0, 4.0], [0.0, 0.0, 0.0]),
              non_inferiority("A near C", "within 1 point", margin=1.0).decide([0.1, -0.1, 0.0])]
    run.write_summary(claims, {"acc": 0.5}, plot_metrics=[])
    return run


def test_main_report_has_the_claim_columns_and_no_smoke_line(tmp_path):
    text = write_report(make_run(tmp_path, smoke=False).path, "Toy").read_text()
    assert SMOKE_LINE not in text
    assert "| A beats B *(post hoc)* | A above B | superiority | 3 | 3 [0.5159, 5.484] | **reproduced** |" in text
    assert "| A near C | within 1 point | non-inferiority (1) | 3 |" in text


def test_smoke_report_opens_with_the_smoke_line(tmp_path):
    run = make_run(tmp_path, smoke=True)
    lines = write_report(run.path, "Toy").read_text().splitlines()
    assert lines[0] == "# Toy" and lines[2] == SMOKE_LINE
    assert json.loads((run.path / "summary.json").read_text())["claims"][0]["post_hoc"] is True
