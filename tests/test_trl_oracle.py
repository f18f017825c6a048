"""TRL as the oracle for moving references: refexp's DPO with ``reference=ema`` / ``periodic_reset`` against
TRL 1.16's ``DPOTrainer(sync_ref_model=True)`` on the same pairs from the same weights, step by step.

TRL's ``SyncRefModelCallback`` is TR-DPO's update (Gorbatovski et al. 2024): after optimizer step k with
``k % ref_model_sync_steps == 0``, ``ref <- alpha * policy + (1 - alpha) * ref`` (``ref_model_mixup_alpha``);
refexp's ``ema`` is the same rule (``reference.alpha``, ``reference.sync_every``) and ``periodic_reset`` the
``alpha = 1`` case (``reference.reset_every``). Each case runs 20 steps with an update every 8 steps (after
steps 8 and 16) and asserts equal per-step losses (float32, 1e-4).

How the two runs see the same thing:
- weights: one tiny HF Llama (hidden 64, 2 layers) written by ``transformers`` with a fixed seed; TRL loads it
  into ``LlamaForCausalLM``, refexp starts from the same directory (``sft.checkpoint`` = the HF dir, whose
  safetensors refexp's weight loader reads for policy and reference; ``model.hf_assets_path`` gives the shape),
  so there is no SFT stage;
- tokens: a word-level ``tokenizers`` vocabulary (``<pad>``, ``<eos>``, ``w2`` ...) without BOS, saved in the HF
  dir; TRL tokenises ``prompt + chosen + eos`` whole and refexp ``prompt`` and ``chosen`` separately + EOS: with
  completions that start with a space both give the same ids (checked below on every pair);
- data order: refexp draws step k's pairs with its seeded permutation (``refexp.components.data_order.batch_ids``); TRL
  gets the pairs already in that order, read sequentially (``train_sampling_strategy="sequential"``), one
  batch per step;
- settings: AdamW (0.9, 0.95, eps 1e-8, no weight decay), constant LR without warm-up, clip 1.0, sigmoid loss,
  beta, live reference forwards (no precompute), float32 on CPU.

refexp runs end to end (``refexp.run.run`` on a composed config: GSM8K-format task files, the preference file,
``metrics.jsonl``'s ``loss/total`` per step); TRL's loss is recorded where ``compute_loss`` returns it. A
fixed-reference TRL run (shared by both cases) shows that the updates change the losses from step 9 on.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from refexp.record.metrics import read_metrics
from refexp.run import run
from tests.helpers.configs import compose_config

pytestmark = pytest.mark.numerics  # tests/README.md: run under other CPU kernels too


# <pad>=0, <eos>=1, w2..w47: fewer ids than the 64 that validation assumes when no checkpoint is given.
VOCAB = 48
STEPS, SYNC = 20, 8  # reference updates after steps 8 and 16
PAIRS_PER_STEP, NUM_PAIRS = 4, 24  # 80 draws from 24 pairs: the permutation wraps epochs mid-step
LR, BETA, SEED = 2e-3, 0.1, 0
EMA_ALPHA = 0.6
TOL = 1e-4


# ---------------------------------------------------------------- the shared workload
def _tokenizer_files(out: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<eos>"] + [f"w{i}" for i in range(2, VOCAB)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens([AddedToken("<pad>", special=True), AddedToken("<eos>", special=True)])
    backend.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>", "pad_token": "<pad>"}))


def _hf_model_dir(out: Path) -> None:
    """A randomly initialised tiny HF Llama (float32 safetensors) with the word tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True)
    _tokenizer_files(out)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, rope_theta=10000.0,
                      rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=None, eos_token_id=1,
                      pad_token_id=0, initializer_range=0.1)
    torch.manual_seed(SEED)
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(str(out), safe_serialization=True)


def _words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(f"w{rng.randrange(2, VOCAB)}" for _ in range(rng.randint(lo, hi)))


def _pairs() -> list[dict]:
    """Random-word pairs of varying lengths; completions open with a space (see the module docstring)."""
    rng = random.Random(1)
    return [{"prompt": _words(rng, 3, 8), "chosen": " " + _words(rng, 2, 6), "rejected": " " + _words(rng, 2, 6)}
            for _ in range(NUM_PAIRS)]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl-oracle")
    _hf_model_dir(root / "hf")
    pairs = _pairs()
    rng = random.Random(2)
    # refexp's task needs prompts for its step-0/final held-out measurements; they play no part in the losses
    gsm = [{"question": _words(rng, 2, 4), "answer": f"{_words(rng, 1, 2)} #### {i}"} for i in range(4)]
    return {"root": root, "hf": root / "hf", "pairs": pairs,
            "pairs_file": _write_jsonl(root / "pairs.jsonl", pairs),
            "gsm_file": _write_jsonl(root / "gsm.jsonl", gsm)}


def _step_order(n: int) -> list[list[int]]:
    """refexp's global pair ids per step (DPOStep's data order)."""
    from refexp.components.data_order import batch_ids

    return [batch_ids(n, PAIRS_PER_STEP, SEED, step) for step in range(1, STEPS + 1)]


# ---------------------------------------------------------------- refexp
def run_refexp(w: dict, run_dir: Path, reference: list[str], loss: tuple[str, ...] = ("algo.loss_type=sigmoid",)
               ) -> list[dict]:
    overrides = [
        f"run_dir={run_dir}", "algo=dpo", *loss, f"algo.beta={BETA}",
        f"algo.pairs_per_step={PAIRS_PER_STEP}", "algo.precompute_ref=false",
        "model=llama3_debug", f"model.hf_assets_path={w['hf']}", "model.max_seq_len=64",
        "task=gsm8k", f"task.train_path={w['gsm_file']}", f"task.eval_path={w['gsm_file']}",
        f"task.preference_path={w['pairs_file']}", "task.max_prompt_len=32", "task.max_new_tokens=8",
        f"sft.checkpoint={w['hf']}",
        f"training.steps={STEPS}", f"training.lr={LR}", f"training.seed={SEED}", "training.warmup_steps=0",
        "training.weight_decay=0.0", "training.beta1=0.9", "training.beta2=0.95", "training.eps=1e-8",
        "training.max_norm=1.0", "training.dtype=float32", "training.device=cpu",
        "checkpoint=disabled", f"eval.every={10 * STEPS}", "eval.num_prompts=2", "eval.kl_prompts=2",
        "logger=none", "logger.progress=false", *reference,
    ]
    run(compose_config(*overrides))
    rows = [r for r in read_metrics(run_dir) if r["step"] >= 1]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    return rows


# ---------------------------------------------------------------- TRL
def run_trl(w: dict, *, sync: bool, alpha: float = 1.0, loss_type: tuple[str, ...] = ("sigmoid",),
            loss_weights: tuple[float, ...] | None = None) -> dict:
    """TRL's per-step losses and, per step, whether its reference model's weights changed in that step."""
    import datasets
    from transformers import AutoTokenizer, LlamaForCausalLM, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    order = [i for ids in _step_order(len(w["pairs"])) for i in ids]
    ds = datasets.Dataset.from_list([w["pairs"][i] for i in order])
    tok = AutoTokenizer.from_pretrained(str(w["hf"]))
    model = LlamaForCausalLM.from_pretrained(str(w["hf"]), dtype=torch.float32)
    losses: list[float] = []
    ref_moved: list[bool] = []

    class Recorder(DPOTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if model.training:
                losses.append(float((out[0] if return_outputs else out).detach()))
            return out

    class RefWatch(TrainerCallback):  # runs after SyncRefModelCallback (added at the trainer's construction)
        def __init__(self):
            self.last = None

        def on_step_end(self, args, state, control, **kw):
            now = torch.cat([p.detach().flatten() for p in trainer.ref_model.parameters()]).clone()
            ref_moved.append(self.last is not None and not torch.equal(now, self.last))
            self.last = now

        def on_train_begin(self, args, state, control, **kw):
            self.last = torch.cat([p.detach().flatten() for p in trainer.ref_model.parameters()]).clone()

    cfg = DPOConfig(
        output_dir=str(w["root"] / f"trl-{sync}-{alpha}-{'-'.join(loss_type)}"), max_steps=STEPS,
        per_device_train_batch_size=PAIRS_PER_STEP,
        gradient_accumulation_steps=1, train_sampling_strategy="sequential", dataloader_drop_last=True,
        dataloader_num_workers=0, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
        optim="adamw_torch", adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=1.0,
        beta=BETA, loss_type=list(loss_type), loss_weights=None if loss_weights is None else list(loss_weights),
        precompute_ref_log_probs=False, sync_ref_model=sync,
        ref_model_mixup_alpha=alpha, ref_model_sync_steps=SYNC, max_length=None, padding_free=False,
        activation_checkpointing=False, use_cpu=True, bf16=False, fp16=False, report_to="none", logging_steps=1,
        save_strategy="no", disable_tqdm=True, seed=SEED,
    )
    trainer = Recorder(model=model, args=cfg, train_dataset=ds, processing_class=tok)
    trainer.add_callback(RefWatch())
    _check_same_tokens(w, trainer)
    threads = torch.get_num_threads()
    try:
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    assert len(losses) == STEPS
    return {"losses": losses, "ref_moved": ref_moved}


def _check_same_tokens(w: dict, trainer) -> None:
    """TRL's tokenised rows equal refexp's packing (``pack_pairs``) of the same pairs (the first epoch's rows:
    a permutation of every pair)."""
    from refexp.algos.dpo_data import pack_pairs
    from refexp.tasks import TextTokenizer

    tok = TextTokenizer.from_dir(str(w["hf"]))
    order = [i for ids in _step_order(len(w["pairs"])) for i in ids]
    for j, row in enumerate(trainer.train_dataset.select(range(len(w["pairs"])))):
        batch = pack_pairs(tok, {k: [w["pairs"][order[j]][k]] for k in ("prompt", "chosen", "rejected")})
        for r, key in enumerate(("chosen_ids", "rejected_ids")):
            mine = batch.tokens_BT[r][batch.tokens_BT[r] != tok.pad_id].tolist()
            assert row["prompt_ids"] + row[key] == mine, (j, key)


# ---------------------------------------------------------------- the comparisons
@pytest.fixture(scope="module")
def trl_fixed(workload):
    return run_trl(workload, sync=False)


CASES = {
    # name: (refexp reference overrides, TRL mixup alpha)
    # alpha=0.6 (TRL's default), not 0.5: a swapped convention (alpha on the reference) must show
    "ema": (["reference=ema", f"reference.alpha={EMA_ALPHA}", f"reference.sync_every={SYNC}"], EMA_ALPHA),
    "periodic_reset": (["reference=periodic_reset", f"reference.reset_every={SYNC}",
                        "reference.reset_optimizer=false"], 1.0),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_moving_reference_matches_trl_sync_ref_model(case, workload, trl_fixed, tmp_path):
    reference, alpha = CASES[case]
    theirs = run_trl(workload, sync=True, alpha=alpha)
    rows = run_refexp(workload, tmp_path / "run", reference)
    ours = [r["loss/total"] for r in rows]
    diff = [abs(a - b) for a, b in zip(ours, theirs["losses"])]
    print(f"\n[{case}] max |refexp - TRL| per-step loss = {max(diff):.3g}")
    print(" step  refexp      TRL         TRL fixed")
    for k, (a, b, c) in enumerate(zip(ours, theirs["losses"], trl_fixed["losses"]), 1):
        print(f" {k:4d}  {a:.7f}  {b:.7f}  {c:.7f}")

    # the updates happened, at the same steps in both
    updates = [k for k in range(1, STEPS + 1) if theirs["ref_moved"][k - 1]]
    assert updates == [SYNC, 2 * SYNC]
    assert [r["ref/version"] for r in rows] == [float(k // SYNC) for k in range(1, STEPS + 1)]
    # step 1: the policy is its reference (-log sigmoid(0)); the training moved the losses away from it
    assert ours[0] == pytest.approx(math.log(2), abs=1e-6)
    assert max(abs(x - math.log(2)) for x in ours[:SYNC]) > 1e-2
    # the same as a fixed reference up to the first update, different after it
    fixed = trl_fixed["losses"]
    assert max(abs(a - b) for a, b in zip(theirs["losses"][:SYNC], fixed[:SYNC])) < TOL
    assert min(abs(a - b) for a, b in zip(theirs["losses"][SYNC:], fixed[SYNC:])) > 10 * TOL
    if alpha == 1.0:  # the step after a reset starts from reference = policy
        for k in (SYNC + 1, 2 * SYNC + 1):
            assert ours[k - 1] == pytest.approx(math.log(2), abs=1e-6)
    # the oracle
    assert max(diff) < TOL, diff


NLL_WEIGHT = 0.5
LOSS_CASES = {
    # name: (refexp loss overrides, TRL loss_type, TRL loss_weights)
    "rpo": (("algo.loss_type=sigmoid", f"algo.nll_weight={NLL_WEIGHT}"), ("sigmoid", "sft"), (1.0, NLL_WEIGHT)),
    "nll_only": (("algo.loss_type=sft",), ("sft",), None),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(LOSS_CASES))
def test_nll_terms_match_trl(case, workload, tmp_path):
    """RPO (DPO + weighted NLL on chosen, TRL's loss_type=["sigmoid", "sft"]) and the NLL-only baseline
    (loss_type="sft") against TRL 1.16 with a fixed reference, step by step."""
    ours_overrides, loss_type, weights = LOSS_CASES[case]
    theirs = run_trl(workload, sync=False, loss_type=loss_type, loss_weights=weights)["losses"]
    ours = [r["loss/total"] for r in run_refexp(workload, tmp_path / "run", ["reference=fixed"], ours_overrides)]
    diff = [abs(a - b) for a, b in zip(ours, theirs)]
    print(f"\n[{case}] max |refexp - TRL| per-step loss = {max(diff):.3g}")
    assert max(diff) < TOL, diff
    assert max(abs(a - b) for a, b in zip(ours, ours[1:])) > 10 * TOL  # the losses moved: training happened
