"""Files a report reads but did not write (a copied sweep, a committed runs.tar.xz) are data: nothing in them runs or
reads this machine (a resolver in ``.hydra/config.yaml``), prints as markup (raw HTML in report.md), or stops the report
with a traceback (a reward that is text); a bad command line is one error line before anything is written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from refexp.report import build_report
from refexp.report.__main__ import main as report_main
from tests.helpers.report_sweep import make_sweep

ROOT = Path(__file__).resolve().parent.parent
SECRET = "hunter2-do-not-print"


def _edit_config(run_dir, **top_level) -> None:
    path = run_dir / ".hydra" / "config.yaml"
    config = yaml.safe_load(path.read_text()) | top_level
    path.write_text(yaml.safe_dump(config))


def _written(sweep) -> str:
    return "".join((sweep / name).read_text() for name in ("report.md", "report.html", "summary.json"))


def test_a_report_runs_no_resolver_of_a_config_it_reads(tmp_path, monkeypatch):
    """A run without resolved_config.yaml whose .hydra/config.yaml asks for ``${oc.env:...}``: the report shows the
    text, never the variable; a node interpolation beside it is still followed."""
    monkeypatch.setenv("REFEXP_TEST_SECRET", SECRET)
    make_sweep(tmp_path)
    for run in ("0", "1", "2"):
        _edit_config(tmp_path / run, model={"name": "${oc.env:REFEXP_TEST_SECRET}", "flavor": "${algo.name}"})
    report = build_report(tmp_path, baseline="fixed")
    assert SECRET not in _written(tmp_path)
    run = next(r for r in report.runs if r.name == "0")
    assert run.config["model"] == {"name": "${oc.env:REFEXP_TEST_SECRET}", "flavor": "grpo"}
    assert "${oc.env:REFEXP_TEST_SECRET}" in (tmp_path / "report.md").read_text()


def test_a_sample_whose_reward_is_text_prints_as_written(tmp_path):
    make_sweep(tmp_path)
    with open(tmp_path / "0" / "samples.jsonl", "w") as f:
        f.write(json.dumps({"step": 40, "kind": "eval", "prompt": "1+1", "completion": "2", "answer": "2",
                            "reward": "high"}) + "\n")
    build_report(tmp_path, baseline="fixed")
    md = (tmp_path / "report.md").read_text()
    assert "| grpo | fixed | 0 | 1+1 | 2 | 2 | high (not a number) |" in md


def _files(sweep) -> dict:
    return {name: (sweep / name).read_bytes() for name in ("report.md", "report.html", "summary.json")}


@pytest.mark.parametrize("margin", ["inf", "-inf", "nan", "0"])
def test_an_equivalence_margin_that_is_no_finite_positive_number_is_refused_before_anything_is_written(
        tmp_path, capsys, margin):
    make_sweep(tmp_path)
    build_report(tmp_path, baseline="fixed")
    before = _files(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        report_main([str(tmp_path), "--baseline", "fixed", f"--equivalence-margin={margin}"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"--equivalence-margin={float(margin)} is invalid: expected a finite number > 0")
    assert _files(tmp_path) == before
    with pytest.raises(ValueError, match="expected a finite number > 0"):
        build_report(tmp_path, baseline="fixed", margin=float(margin))
    assert _files(tmp_path) == before


def test_a_declared_infinite_margin_is_a_block_problem_not_a_crash():
    from refexp.report.reading.comparison_plan import block_problem

    block = {"arm_key": "grpo_variant", "arms": ["fixed", "ema"], "baseline": "fixed", "seeds": [0, 1],
             "equivalence_margin": float("inf")}
    assert block_problem(block) == ("comparison.equivalence_margin=inf is invalid: expected a finite number > 0, "
                                    "or null")


def test_a_report_that_cannot_be_rendered_leaves_the_previous_files_as_they_were(tmp_path, monkeypatch):
    """summary.json's rendering fails (here forced): report.md and report.html are not rewritten beside the old
    summary.json."""
    make_sweep(tmp_path)
    build_report(tmp_path, baseline="fixed")
    before = _files(tmp_path)

    def broken(report):
        raise ValueError("Out of range float values are not JSON compliant")

    monkeypatch.setattr("refexp.report.writing.render.summary_dict", broken)
    with pytest.raises(ValueError, match="JSON compliant"):
        build_report(tmp_path, baseline="ema")  # another baseline: other text, were it written
    assert _files(tmp_path) == before


MALFORMED_SUMMARIES = {
    "a list": ([1, 2], "the top level is invalid in a report's summary.json: expected an object"),
    "algos a list": ({"algos": []}, ("algos is invalid in a report's summary.json: expected an object of "
                                     "algorithms")),
    "a group without a label": ({"algos": {"grpo": {"baseline": "fixed", "groups": [{"metrics": {}}]}}},
                                ("algos.grpo.groups[0].label is invalid in a report's summary.json: expected a group "
                                 "label (text)")),
    "a mean that is text": ({"algos": {"grpo": {"baseline": "fixed", "groups": [
        {"label": "fixed", "metrics": {"acc_final": {"mean": "0.5"}}}]}}},
        ("algos.grpo.groups[0].metrics.acc_final.mean is invalid in a report's summary.json: expected a "
         "number")),
    "values that are text": ({"algos": {"grpo": {"baseline": "fixed", "groups": [
        {"label": "ema", "paired_vs_baseline": {"acc_final": {"seed_only_t95": {"values": ["a"]}}}}]}}},
        ("algos.grpo.groups[0].paired_vs_baseline.acc_final.seed_only_t95.values is invalid in a report's "
         "summary.json: expected a list of numbers")),
    "a start's comparisons a list": ({"algos": {"grpo": {"baseline": "fixed", "groups": [],
                                                         "within_sft_start": {"s0": {"paired_vs_baseline": []}}}}},
                                     "algos.grpo.within_sft_start.s0.paired_vs_baseline is invalid"),
}


@pytest.mark.parametrize("case", MALFORMED_SUMMARIES, ids=str)
def test_a_malformed_pilot_summary_is_one_error_line_naming_its_field(tmp_path, capsys, case):
    from refexp.report.power.pilot import PilotError, read_pilot
    from refexp.report.reading.comparison_plan import PRIMARY_ENDPOINTS

    assert PRIMARY_ENDPOINTS["eval/accuracy"] == "acc_final"  # the key the cases name
    summary, message = MALFORMED_SUMMARIES[case]
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(PilotError, match=re.escape(f"--pilot {tmp_path / 'summary.json'}: {message}")):
        read_pilot(tmp_path / "summary.json")
    out = tmp_path / "plan.md"
    assert report_main(["--plan", "quickstart", "--pilot", str(tmp_path / "summary.json"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and message in err[0] and not out.exists()


def test_a_plan_written_to_a_missing_directory_is_refused_before_it_is_computed(tmp_path, capsys):
    pilot = ROOT / "docs" / "quickstart" / "summary.json"
    for out, why in ((tmp_path / "no" / "plan.md", f"no directory {tmp_path / 'no'}"), (tmp_path, "a directory")):
        with pytest.raises(SystemExit) as exit_:
            report_main(["--plan", "quickstart", "--pilot", str(pilot), "--out", str(out)])
        assert exit_.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith(
            f"--out {out} is invalid: expected a file in an existing directory ({why})")
    assert not (tmp_path / "no").exists()


def test_report_md_prints_html_in_run_names_and_completions_as_text(tmp_path):
    """A run dir named ``<svg onload=...>`` (a failed run, listed by name) and a completion holding ``<script>``:
    report.md writes each ``<`` that could open a tag as ``&lt;``, as report.html escapes them; a ``<`` that opens no
    HTML (``p <= alpha``) stays."""
    make_sweep(tmp_path)
    name = "<svg onload=alert(1)>"
    (tmp_path / "12").rename(tmp_path / name)
    with open(tmp_path / "0" / "samples.jsonl", "w") as f:
        f.write(json.dumps({"step": 40, "kind": "eval", "prompt": "<!-- hi --> 1+1", "answer": "2", "reward": 1.0,
                            "completion": "<script>alert(1)</script> <answer>2</answer>"}) + "\n")
    build_report(tmp_path, baseline="fixed")
    md = (tmp_path / "report.md").read_text()
    assert re.search(r"<[A-Za-z/!?]", md) is None
    assert "| &lt;svg onload=alert(1)> | grpo | kl_triggered | failed |" in md
    assert "| &lt;!-- hi --> 1+1 | &lt;script>alert(1)&lt;/script> &lt;answer>2&lt;/answer> | 2 | 1 |" in md
    assert "<= alpha" in md
    page = (tmp_path / "report.html").read_text()
    assert "<script" not in page and "<svg" not in page and "&lt;svg onload=alert(1)&gt;" in page
