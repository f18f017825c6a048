"""The bench scripts run end to end at minimal sizes (not timed: benchmarks print figures, tests only check
that every script still drives refexp's current interfaces and prints what bench/README.md documents).

Everything runs in this process (a subprocess would pay torchtitan's import again): ``bench_step.py
--in-process``, ``compare_trl``'s prepare + one interleaved worker, ``scaling.py --in-process``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
GPU = BENCH / "gpu"  # gpu_smoke.py, the GPU check's figures
sys.path[:0] = [str(BENCH), str(GPU)]

TINY_BENCH_ARGS = ["--dim", "32", "--layers", "1", "--heads", "2", "--ffn", "64", "--vocab", "64", "--threads", "1",
        "--steps", "1", "--warmup", "1", "--peak-seconds", "0", "--peak-sizes", "128", "--no-probe-peak"]
BATCH = ["--prompts", "2", "--group", "2", "--new-tokens", "3", "--prompt-len", "4", "--pairs", "2",
         "--completion-len", "3"]


def test_bench_step_prints_one_line_per_configuration(tmp_path, capsys):
    import bench_step

    rows = bench_step.main([*TINY_BENCH_ARGS, *BATCH, "--in-process", "--workdir", str(tmp_path),
                            "--algo", "grpo", "dpo", "--reference", "fixed", "none", "--precompute-ref", "both"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert len(lines) == len(rows) == 5  # grpo x {fixed, none}, dpo x {fixed live, fixed cached, none}
    by = {(r["algo"], r["reference"], r["precompute_ref"]): r for r in rows}
    for r in rows:
        assert r["steps_per_s"] > 0 and r["tokens_per_s"] > 0 and r["matmul_peak_gflops"] > 0
        assert set(r["phases_s"]) == {"generation", "policy_fwd_bwd", "reference_fwd", "ref_update", "optimizer",
                                      "other"}
        assert r["phases_s"]["policy_fwd_bwd"] > 0 and r["mfu"]["policy_fwd_bwd"] > 0
    assert by[("grpo", "fixed", False)]["gen_tokens_per_s"] > 0
    assert by[("grpo", "none", False)]["beta"] == 0.0 and by[("dpo", "none", False)]["loss"] == "simpo"
    # what the memory comparison rests on: no reference weights held without a live reference
    assert by[("dpo", "fixed", False)]["ref_params_resident"] == by[("dpo", "fixed", False)]["policy_params"]
    assert by[("dpo", "fixed", True)]["ref_params_resident"] == 0
    assert by[("dpo", "fixed", True)]["ref_source"] == "PrecomputedRefLogps"
    assert by[("grpo", "none", False)]["ref_params_resident"] == 0
    # the FLOPs count the output layer where DPOStep runs it: each chosen and rejected completion token (2 pairs x
    # 2 x 3 tokens), not every position of the trunk's shared rows (a pair's prompt 4 once, then each completion
    # of 3 after a bridge token: 2 x (4 + 2 x 4 - 1))
    dpo = by[("dpo", "fixed", False)]
    assert (dpo["trunk_positions"], dpo["output_layer_positions"]) == (2 * (4 + 2 * 4 - 1), 2 * 2 * 3)


def test_bench_output_layer_alternates_full_and_selected_processes(capsys):
    """Two whole processes (full logits, then the selection), their medians and ratios (no lock: a test)."""
    import bench_output_layer

    out = bench_output_layer.main(["--repeats", "1", "--lock", "", "--", *TINY_BENCH_ARGS, *BATCH, "--algo", "grpo"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert [r.get("output_layer") for r in lines[:2]] == ["full", "selected"] and lines[2] == out
    assert out["full"]["step_s"] > 0 and out["selected"]["peak_rss_timed_mb"] > 0
    assert out["selected_over_full"]["step_s"] > 0 and out["paired_ratio_median"]["step_s"] > 0


@pytest.mark.parametrize("lora", [[], ["--lora-rank", "2"]])
def test_bench_decode_measures_every_path_on_the_same_tokens(capsys, lora):
    import bench_decode

    bench_decode.main(["--rows", "4", "--group", "2", "--prompt-len", "4", "--new-tokens", "3", "--rounds", "1",
                       "--dim", "32", "--layers", "1", "--heads", "2", "--ffn", "64", "--vocab", "64", "--threads", "1",
                       "--markdown", *lora])
    out = capsys.readouterr().out
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert [r["path"] for r in lines] == list(bench_decode.PATHS)
    for r in lines:
        # a difference of two timings at 3 tokens: its sign is noise on a loaded machine, its presence is the check
        assert math.isfinite(r["ms_per_token"]) and r["ops_per_token"] > 0 and r["same_tokens_every_path"], r
    plain, modules = (next(r for r in lines if r["path"] == p) for p in ("plain", "modules"))
    assert plain["ops_per_token"] < modules["ops_per_token"]  # the plain step's point: fewer operators
    assert "| 4 | plain |" in out


def test_bench_shared_attention_times_both_ways_and_reports_autos_pick(capsys):
    import bench_shared_attention

    rows = bench_shared_attention.main(["--layouts", "2x2x4x4", "1x8x2x24", "--heads", "2", "--head-dim", "8",
                                        "--threads", "1", "--reps", "1", "--markdown"])
    assert [r["layout"] for r in rows] == ["2x2x4x4", "1x8x2x24"]
    short, long = rows
    assert short["S"] == 4 + 4 + 5 and short["N"] == 4 and short["T"] == 8
    assert short["auto_picks"] == "mask" and long["auto_picks"] == "rows"  # 8 * 26 * 126 < 201^2
    assert all(r["mask_ms"] > 0 and r["rows_ms"] > 0 for r in rows)
    assert "| 1x8x2x24 | 201 |" in capsys.readouterr().out


def test_compare_trl_interleaved_worker(tmp_path):
    import compare_trl

    args = compare_trl.parse_args(["--workdir", str(tmp_path), "--steps", "1", "--warmup", "1", "--threads", "1",
                                   "--pairs", "2", "--prompts", "2", "--group", "2", "--prompt-len", "4",
                                   "--completion-len", "3", "--new-tokens", "3",
                                   "--refexp-args=--peak-seconds 0 --peak-sizes 128 --no-probe-peak"])
    compare_trl.prepare(tmp_path, args)  # also checks HF and torchtitan logits agree
    assert json.loads((tmp_path / "ready.json").read_text())["max_logit_diff"] < 1e-4
    for name in ("dpo_live", "grpo_ref"):
        row = compare_trl.pair_worker(args, name)
        assert row["steps"] == 1 and row["median_ratio"] > 0 and row["refexp"]["algo"] == name.split("_")[0]
    torch.set_num_threads(1)


@pytest.mark.slow
def test_compare_trl_on_smollm2_feeds_both_frameworks_the_same_tokens(tmp_path, smollm2_dir, monkeypatch):
    """``--model smollm2_135m``: TRL's copy holds the converted weights (prepare checks the logits agree), both
    sides read the same texts of exactly ``--prompt-len`` tokens, and the HF generate rate is measured."""
    import bench_step
    import compare_trl
    from transformers import AutoTokenizer

    monkeypatch.setenv("REFEXP_CACHE", str(smollm2_dir.parent.parent))
    args = compare_trl.parse_args(["--model", "smollm2_135m", "--workdir", str(tmp_path), "--steps", "1",
                                   "--warmup", "1", "--threads", "1", "--prompts", "2", "--group", "2",
                                   "--prompt-len", "5", "--new-tokens", "2",
                                   "--refexp-args=--peak-seconds 0 --peak-sizes 128 --no-probe-peak"])
    compare_trl.prepare(tmp_path, args)
    assert json.loads((tmp_path / "ready.json").read_text())["max_logit_diff"] < 1e-3
    texts = compare_trl.bench_texts(args, 4, 5, seed=0, eos_outside=True)
    trl_tok = AutoTokenizer.from_pretrained(str(tmp_path / "tok-grpo"))
    ours = bench_step.tokenizer(bench_step.parse_args(["--hf-dir", str(smollm2_dir)]), eos_outside=True)
    for text in texts:
        ids = trl_tok(text, add_special_tokens=False)["input_ids"]
        assert ids == ours.encode(text, add_bos=True) and len(ids) == 5
    assert trl_tok.eos_token_id == ours.eos_id == 49152  # outside the model: no completion stops early
    row = compare_trl.pair_worker(args, "grpo_ref")
    assert row["steps"] == 1 and row["refexp"]["batch"]["new_tokens"] == 2 and row["hf_generate_tokens_per_s"] > 0
    torch.set_num_threads(1)


def test_scaling_size_sweep(tmp_path, capsys):
    import scaling

    scaling.main(["--sweeps", "size", "--sizes", "xs", "--algos", "dpo", "--steps", "1", "--warmup", "1",
                  "--threads", "1", "--in-process", "--workdir", str(tmp_path),
                  "--shape-args",
                  " ".join(BATCH[6:] + ["--peak-seconds", "0", "--peak-sizes", "128", "--no-probe-peak"])])
    out = capsys.readouterr().out
    assert "**Model size" in out and "| dpo | xs |" in out


def test_flop_count_matches_a_hand_count():
    import _common as C

    s = C.Shape(dim=8, layers=1, heads=2, ffn=16, vocab=10)
    # matmul params: qkv 3*64 + wo 64 + ffn 3*128 + lm head 80 = 720; causal attention over T=2 sees 1+2 keys
    assert s.matmul_params() == 720
    assert s.forward_flops([2]) == 2 * (720 - 80) * 2 + 2 * 80 * 2 + 4 * 8 * 1 * (2 * 3 / 2)


@pytest.mark.slow
def test_gpu_smoke_toy_runs_every_figure_on_cpu(tmp_path):
    """``gpu_smoke.py --toy`` as the GPU machine runs it (a subprocess: its own budget, watchdog and exit code):
    the environment line first, then one line per figure, each with a finite value; on CPU at toy size every
    figure can run, and only the RSS-based memory reading may be reported as not measurable."""
    import gpu_smoke

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, str(GPU / "gpu_smoke.py"), "--toy", "--device", "cpu", "--threads", "1",
                        "--budget-s", "150", "--workdir", str(tmp_path)],
                       capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    assert lines[0]["figure"] == "env" and lines[0]["torch"] == torch.__version__
    assert lines[0]["refexp_titan_import"] == "ok" and lines[0]["torchtitan"]
    assert lines[-1]["figure"] == "summary"
    by = {row["figure"]: row for row in lines[1:-1]}
    assert list(by) == list(gpu_smoke.FIGURES)
    for name, row in by.items():
        value = row["value"]
        assert (value is not None and math.isfinite(value)) or row.get("error") or row.get("skipped"), row
        if name.startswith("peak_mem"):  # an RSS rise: may be 0 when freed pages were reused
            assert (value is not None and value >= 0) or "not measurable" in row["error"], row
        else:
            assert value is not None and value > 0, row
    assert by["train_mfu"]["peak_source"] == "measured_float32_matmul"  # no table entry for a CPU
    for rows in gpu_smoke.GEN_ROWS:  # EOS outside the vocabulary: every row decodes all its tokens
        for name in (f"gen_tokens_per_s_{rows}", f"gen_tokens_per_s_{rows}_static"):
            g = by[name]
            assert g["generated_tokens"] == rows * g["new_tokens"] and g["static_decode"] == name.endswith("static")
    assert by["grpo_e2e_3steps"]["steps"] == 3 and by["grpo_e2e_3steps"]["step_s"] > 0
    assert lines[-1]["ok"] >= 7 and lines[-1]["skipped"] == 0


def test_gpu_smoke_skips_what_the_budget_leaves_no_time_for(capsys):
    import gpu_smoke

    counts = gpu_smoke.main(["--toy", "--device", "cpu", "--budget-s", "0"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert lines[0]["figure"] == "env" and lines[-1]["figure"] == "summary"
    assert [row["figure"] for row in lines[1:-1]] == list(gpu_smoke.FIGURES)
    assert all(row["value"] is None and "out of time" in row["skipped"] for row in lines[1:-1])
    assert counts == {"ok": 0, "error": 0, "skipped": len(gpu_smoke.FIGURES)}


def test_bench_step_trains_a_lora_policy_with_a_free_fixed_reference(tmp_path, capsys):
    import bench_step

    rows = bench_step.main([*TINY_BENCH_ARGS, *BATCH, "--in-process", "--workdir", str(tmp_path), "--algo", "grpo",
                            "--reference", "fixed", "ema", "--lora-rank", "2"])
    by = {r["reference"]: r for r in rows}
    assert all(r["lora_rank"] == 2 and 0 < r["trainable_params"] < r["policy_params"] for r in rows)
    assert by["fixed"]["ref_params_resident"] == 0  # the base with the adapters off
    assert by["ema"]["ref_params_resident"] > by["fixed"]["trainable_params"]  # the dense delta


def test_compare_trl_lora_mode_runs_every_side_and_reports_the_flop_accounting(tmp_path, capsys):
    """``--mode lora``'s rounds on the tiny random Llama, every side in this process (refexp's through bench_step,
    TRL + peft's through the TRL worker): each side's figures, the FLOP accounting of each framework's positions, and
    the ratios of the round."""
    pytest.importorskip("peft")
    import bench_step
    import compare_trl
    import lora_comparison

    args = compare_trl.parse_args(["--mode", "lora", "--lora-rank", "2", "--workdir", str(tmp_path), "--steps", "1",
                                   "--warmup", "1", "--threads", "1", "--prompts", "2", "--group", "2",
                                   "--prompt-len", "4", "--new-tokens", "3",
                                   "--refexp-args=--peak-seconds 0 --peak-sizes 128 --no-probe-peak"])
    compare_trl.prepare(tmp_path, args)

    def run_side(side: str) -> dict:
        if side == "trl_lora":
            return compare_trl.trl_worker(args, "grpo_ref")
        argv = compare_trl.lora_side_argv(args, [], side)
        rows = bench_step.main([*argv[1:], "--in-process"])
        return rows[-1]

    records = lora_comparison.run(1, run_side)
    torch.set_num_threads(1)
    sides = records[0]["sides"]
    lora, full, trl, noref = (sides[s] for s in lora_comparison.SIDES)
    assert 0 < lora["trainable_params"] < trl["trainable_params"] < full["trainable_params"]  # peft: q, k, v each an A
    # refexp: one row per prompt (4 + 2 x (3 + 1) - 1 positions), the output layer at the 2 x 2 x 3 completion tokens;
    # TRL on a CPU: one row per completion (4 + 3), the output layer at every position but the last
    assert (lora["trunk_positions"], lora["output_layer_positions"]) == (2 * 11, 12)
    assert (trl["trunk_positions"], trl["output_layer_positions"]) == (4 * 7, 4 * 6)
    assert lora["gflop_per_step"] < full["gflop_per_step"] and noref["gflop_per_step"] < lora["gflop_per_step"]
    assert all(s["gflop_per_s"] > 0 and 0 < s["of_peak"] for s in sides.values())
    assert records[0]["lora_over_trl_per_flop"] < records[0]["lora_over_trl"]  # TRL runs more FLOPs per step
    table = lora_comparison.summary(records)
    assert "| TRL + peft LoRA |" in table and "| peak RSS: refexp LoRA fixed reference ÷ reference=none |" in table


def test_grpo_step_flops_under_lora_drop_the_frozen_weights_gradients():
    import _common as C

    s = C.Shape(dim=8, layers=1, heads=2, ffn=16, vocab=10)
    kw = dict(prompts=1, group=1, prompt_len=1, new_tokens=1, shared_prompt=False, output_layer="all",
              reference=False)
    full, lora = C.grpo_step_flops(s, **kw), C.grpo_step_flops(s, adapter_params=5, **kw)
    parts = s.forward_parts([2])
    assert full["policy_fwd_bwd"] == 3 * s.forward_flops([2])
    # 2 positions: linear x 2 (forward, input gradient), attention x 3, adapters (2 FLOPs x 5 params x 2) x 3
    assert lora["policy_fwd_bwd"] == 2 * parts["linear"] + 3 * parts["attention"] + 3 * 2 * 5 * 2
