"""``refexp-report SWEEP_DIR [--target 0.6] [--baseline fixed] [--at-steps 500] [--alpha 0.05]
[--equivalence-margin 0.02] [--allow-mixed] [--quiet] [--wandb] [--wandb-workspace]``: write the sweep's report and
print its table and where it went. ``refexp-report --plan EXPERIMENT --pilot SWEEP_OR_SUMMARY [--out FILE]``: print
(and write) the power plan of a declared experiment, its variance components from the pilot. Exit status 2, nothing
written, when SWEEP_DIR holds no run. A sweep that
declares no comparison and names no ``--baseline`` gets an exploratory report against ``fixed``, else its first
group (``refexp/report/reading/comparison_plan.py``, ``default_baseline``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from refexp.report.build import NoRunsError, build_report
from refexp.report.reading.archive import ArchiveError
from refexp.report.reading.comparison_plan import valid_margin
from refexp.report.writing.table import format_table


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="refexp-report",
        description="Compare the reference strategies of a Hydra multirun dir: writes report.md, "
                    "report.html, summary.json and report_plots/*.png into SWEEP_DIR.")
    parser.add_argument("sweep_dir", type=Path, metavar="SWEEP_DIR", nargs="?",
                        help="a multirun dir (multirun/<experiment>/<time>) or a single run dir")
    parser.add_argument("--plan", metavar="EXPERIMENT", default=None,
                        help="instead of a report: the power plan of conf/experiment/EXPERIMENT.yaml (its primary "
                             "contrasts, seeds, SFT starts, prompts, --alpha): the smallest difference it detects with "
                             "80%% power beside its equivalence margin; needs --pilot")
    parser.add_argument("--pilot", type=Path, metavar="SWEEP_OR_SUMMARY", default=None,
                        help="with --plan: the sweep dir, a dir holding runs.tar.xz (docs/NAME), a runs.tar.xz, or "
                             "a summary.json whose differences give the variance components (SFT starts, seeds, "
                             "prompts); a matched design (comparison.matched.at) needs per-run curves, not a summary")
    parser.add_argument("--pilot-metric", metavar="METRIC", default=None,
                        help="with --plan: read the pilot's differences on this held-out metric instead of the "
                             "experiment's first primary metric (a pilot that measured the same kind of quantity "
                             "under another name, e.g. eval/accuracy for a design on eval/gold); the plan says so")
    parser.add_argument("--out", type=Path, metavar="FILE", default=None,
                        help="with --plan: also write the plan there (conf/experiment/EXPERIMENT.plan.md beside "
                             "the experiment, committed with it)")
    parser.add_argument("--target", type=float, default=None,
                        help="held-out accuracy for the steps-to-target column (default: halfway from the "
                             "start accuracy to the best group's final accuracy, per algorithm)")
    parser.add_argument("--baseline", default=None,
                        help="the group every other group is paired against, a group label or a swept variant (fixed); "
                             "one other than the declared baseline makes the report exploratory; without a "
                             "declared comparison the default is fixed where a group is that, else the first group")
    parser.add_argument("--alpha", type=float, default=0.05,
                        help="family-wise error rate of the verdicts (Holm's step-down over the comparisons "
                             "against the baseline decides; default 0.05)")
    parser.add_argument("--equivalence-margin", type=float, default=None, metavar="M",
                        help="claim 'equivalent within ±M' where two one-sided tests put the difference inside "
                             "(-M, +M) (default: the declared comparison block's equivalence_margin, else no claim "
                             "of no difference is made)")
    parser.add_argument("--allow-mixed", action="store_true",
                        help="count in the verdict the runs outside the declared comparison (other seeds or "
                             "arms) and those from another refexp commit or thread count than most runs")
    parser.add_argument("--at-steps", default="", metavar="S[,S...]",
                        help="add, per step S, the headline metric (comparison.metric, else held-out accuracy) "
                             "at S and the gain after it (final minus that): whether a group kept improving after "
                             "S (e.g. --at-steps 500)")
    parser.add_argument("--quiet", action="store_true", help="print only the report's path")
    parser.add_argument("--wandb", action="store_true",
                        help="also log the table and plots to W&B (a new job_type=report run in the training "
                             "runs' project); never fails the report")
    parser.add_argument("--wandb-workspace", action="store_true",
                        help="save a W&B workspace comparing the sweep's strategies (with an API key), else "
                             "write its spec to SWEEP_DIR/wandb_workspace.json")
    return parser


def _parse(argv: Optional[Sequence[str]]) -> tuple[argparse.Namespace, tuple[int, ...]]:
    """The arguments, each checked (argparse's error, exit 2, before anything is read), and the ``--at-steps``."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.plan is not None or args.pilot is not None or args.out is not None or args.pilot_metric is not None:
        if args.plan is None or args.pilot is None or args.sweep_dir is not None:
            parser.error("a power plan is --plan EXPERIMENT --pilot SWEEP_OR_SUMMARY [--out FILE], without SWEEP_DIR")
        if not args.pilot.exists():
            parser.error(f"--pilot {args.pilot} does not exist: expected a sweep dir or a summary.json")
        if args.out is not None and (args.out.is_dir() or not args.out.parent.is_dir()):
            parser.error(f"--out {args.out} is invalid: expected a file in an existing directory "
                         f"({'a directory' if args.out.is_dir() else f'no directory {args.out.parent}'})")
        from refexp.report.reading.comparison_plan import PRIMARY_ENDPOINTS
        if args.pilot_metric is not None and args.pilot_metric not in PRIMARY_ENDPOINTS:
            parser.error(f"--pilot-metric {args.pilot_metric} is invalid: expected a held-out metric the report "
                         f"compares per prompt, one of {', '.join(PRIMARY_ENDPOINTS)}")
    elif args.sweep_dir is None:
        parser.error("SWEEP_DIR is required (or --plan EXPERIMENT --pilot SWEEP_OR_SUMMARY)")
    elif not args.sweep_dir.is_dir():
        parser.error(f"SWEEP_DIR {args.sweep_dir} is not a directory")
    if args.target is not None and not 0.0 <= args.target <= 1.0:
        parser.error(f"--target={args.target} is invalid: expected an accuracy in [0, 1]")

    if not 0.0 < args.alpha < 1.0:
        parser.error(f"--alpha={args.alpha} is invalid: expected a number in (0, 1)")
    if args.equivalence_margin is not None and not valid_margin(args.equivalence_margin):
        parser.error(f"--equivalence-margin={args.equivalence_margin} is invalid: expected a finite number > 0")
    try:
        at_steps = tuple(int(s) for s in args.at_steps.split(",") if s.strip())
    except ValueError:
        parser.error(f"--at-steps={args.at_steps!r} is invalid: expected steps separated by commas (500,1000)")
    if any(s < 0 for s in at_steps):
        parser.error(f"--at-steps={args.at_steps!r} is invalid: expected steps >= 0")
    return args, at_steps


def _plan(args: argparse.Namespace) -> int:
    """Print (and with --out write) the power plan; a bad experiment or pilot is one error line, exit 2."""
    from refexp.report.power.design import full_plan
    from refexp.report.power.experiment import ExperimentError, read_experiment
    from refexp.report.power.pilot import PilotError

    try:
        exp = read_experiment(args.plan)
        text = full_plan(exp, args.pilot, args.pilot_metric or exp.metrics[0], args.alpha)
    except (ExperimentError, PilotError, ArchiveError) as e:
        print(f"refexp-report: error: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    if args.out is not None:
        from refexp.record.atomic import write_text_atomic

        write_text_atomic(args.out, text, encoding="utf-8")
        print(f"plan: {args.out}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, at_steps = _parse(argv)
    if args.plan is not None:
        return _plan(args)
    try:
        report = build_report(args.sweep_dir, target=args.target, baseline=args.baseline, at_steps=at_steps,
                              alpha=args.alpha, margin=args.equivalence_margin, allow_mixed=args.allow_mixed)
    except (NoRunsError, ArchiveError) as e:
        print(f"refexp-report: error: {e}", file=sys.stderr)
        return 2
    if report.plan.problem:  # one line, then the report as an exploratory one
        print(f"refexp-report: the comparison block cannot be read ({report.plan.problem}): the report is "
              f"exploratory", file=sys.stderr)
    if not args.quiet:
        print(format_table(report), end="")
    print(f"report: {report.markdown_path}  (html: {report.html_path.name}, numbers: {report.summary_path.name})")
    if args.wandb:
        from refexp.report.writing.wandb_table import log_to_wandb

        log_to_wandb(report, start_run=True)
    if args.wandb_workspace:
        from refexp.report.writing.wandb_workspace import save_workspace

        try:
            print(f"W&B workspace: {save_workspace(report)}")
        except Exception as e:  # the report on disk stands whatever W&B says
            print(f"refexp-report: saving the W&B workspace failed ({type(e).__name__}: {e})", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
