"""Starting from a pretrained checkpoint (``sft.enable=false``) with its own chat template and stop ids,
and exporting a policy that transformers loads and generates with. The checkpoint is a tiny Qwen3 the
test writes, with a BPE tokenizer whose chat template is ChatML-shaped and ends turns with
``<|im_end|>`` (a second eos id in generation_config.json)."""

from __future__ import annotations

import json

import pytest
import torch

from refexp.config import ConfigError, TaskConfig
from refexp.config.root import to_object
from refexp.record.metrics import read_metrics
from refexp.run import run
from tests.helpers.configs import compose_root, compose_tiny_run
from tests.helpers.tiny_qwen3 import CHAT_TEMPLATE, MODEL, QUESTIONS, SYSTEM

transformers = pytest.importorskip("transformers")

@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("gsm8k") / "gsm8k.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in QUESTIONS))
    return path


def _grpo(run_dir, hf_dir, data, *extra):
    return compose_tiny_run(
        run_dir, *MODEL, f"model.hf_assets_path={hf_dir}", "sft.enable=false",
        "task=gsm8k", f"task.train_path={data}", f"task.eval_path={data}", "task.chat_template=true",
        f"task.system_prompt={SYSTEM!r}", "+task.chat_template_kwargs.enable_thinking=false",
        "task.max_prompt_len=128", "task.max_new_tokens=8",
        "algo=grpo", "algo.prompts_per_step=2", "algo.group_size=2", "training.steps=2",
        "eval.num_prompts=4", "eval.kl_prompts=2", "checkpoint.last_save_in_hf=true", *extra)


def test_rendered_prompts_are_the_checkpoints_chat_template(hf_dir, data, tmp_path):
    from refexp.tasks import build_task

    cfg = TaskConfig(name="gsm8k", train_path=str(data), eval_path=str(data), tokenizer_path=str(hf_dir),
                     chat_template=True, system_prompt=SYSTEM, chat_template_kwargs={"enable_thinking": False},
                     max_prompt_len=128, max_new_tokens=64)
    task = build_task(cfg, str(tmp_path), algo="grpo")
    theirs = transformers.AutoTokenizer.from_pretrained(hf_dir)
    for split in (task.train, task.eval):
        for row, (question, solution) in zip(split, QUESTIONS):
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
            assert row["prompt"] == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                               enable_thinking=False)
            assert row["completion"] == solution  # no opening space after the assistant turn's newline
    assert "<think>" in task.eval[0]["prompt"]  # chat_template_kwargs reached the template
    # both eos ids of generation_config.json stop generation
    assert set(task.tokenizer.stop_ids) == {theirs.convert_tokens_to_ids(t) for t in ("<eos>", "<|im_end|>")}
    # without task.chat_template the plain format stays
    plain = build_task(TaskConfig(name="gsm8k", train_path=str(data), eval_path=str(data),
                                  tokenizer_path=str(hf_dir), max_prompt_len=128), str(tmp_path), algo="grpo")
    assert plain.eval[0]["prompt"] == f"Question: {QUESTIONS[0][0]}\nAnswer:"


def test_grpo_from_the_pretrained_checkpoint_and_an_export_that_generates(hf_dir, data, tmp_path):
    eos, im_end = json.loads((hf_dir / "generation_config.json").read_text())["eos_token_id"]
    run_dir = tmp_path / "run"
    final = run(_grpo(run_dir, hf_dir, data))
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2] and final["step"] == 2
    assert rows[0]["kl/init"] == pytest.approx(0.0, abs=1e-6)  # the anchor is the checkpoint the policy starts as
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in rows[1:])

    out = run_dir / "checkpoint" / "hf"
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == CHAT_TEMPLATE and tok.eos_token == "<eos>"
    assert model.generation_config.eos_token_id == [eos, im_end]
    text = tok.apply_chat_template([{"role": "user", "content": QUESTIONS[0][0]}], tokenize=False,
                                   add_generation_prompt=True)
    ids = tok(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        gen = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert gen.shape[1] > ids["input_ids"].shape[1]


@pytest.mark.slow
def test_a_run_from_a_checkpoint_in_the_cache_resumes_with_a_copied_cache(hf_dir, data, tmp_path, monkeypatch):
    """A start checkpoint inside the cache dir (as ``model.pretrained`` converts one into it, then sets
    ``model.hf_assets_path``) resumes from a copy of the cache: the cache dir is a resumable change, and the
    checkpoint's path is the same place in either cache."""
    import shutil

    first, copy = tmp_path / "cache", tmp_path / "copied-cache"
    shutil.copytree(hf_dir, first / "pretrained" / "qwen3")
    monkeypatch.setenv("REFEXP_CACHE", str(first))
    run_dir = tmp_path / "run"
    run(_grpo(run_dir, first / "pretrained" / "qwen3", data))
    shutil.copytree(first, copy, ignore=shutil.ignore_patterns("*.lock"))
    monkeypatch.setenv("REFEXP_CACHE", str(copy))
    final = run(_grpo(run_dir, copy / "pretrained" / "qwen3", data, "training.steps=3"))
    assert final["step"] == 3 and [r["step"] for r in read_metrics(run_dir)] == [0, 1, 2, 3]


def test_export_of_the_embedded_task_loads_with_its_character_tokenizer(tmp_path):
    from refexp import titan
    from refexp.config import ModelConfig
    from refexp.tasks.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    titan.prepare_torchtitan("cpu")
    cfg = ModelConfig(dim=32, n_layers=2, n_heads=2, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=64)
    model = titan.build_model(cfg, vocab_size=tok.vocab_size, device="cpu", seed=0, requires_grad=False)
    titan.export_hf(model, cfg, str(tmp_path / "hf"), tokenizer=tok)
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert (hf_tok.eos_token_id, hf_tok.pad_token_id, hf_tok.bos_token_id) == (tok.eos_id, tok.pad_id, tok.bos_id)
    assert hf_tok("12+34=", add_special_tokens=False)["input_ids"] == tok.encode("12+34=")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert hf_model.generation_config.eos_token_id == tok.eos_id
    x = torch.tensor([tok.encode("12+34=", add_bos=True)])
    with torch.no_grad():
        torch.testing.assert_close(hf_model(x).logits, titan.logits(model, x), atol=1e-4, rtol=0)
        assert hf_model.generate(x, max_new_tokens=3, do_sample=False).shape[1] > x.shape[1]


def test_every_stop_id_ends_generation():
    from refexp import titan
    from refexp.components import sampler
    from refexp.config import ModelConfig
    from refexp.tasks.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    titan.prepare_torchtitan("cpu")
    cfg = ModelConfig(dim=32, n_layers=2, n_heads=2, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=64)
    model = titan.build_model(cfg, vocab_size=tok.vocab_size, device="cpu", seed=0, requires_grad=False)
    free = sampler.generate(model, tok, ["12+34="], max_new_tokens=6, greedy=True)
    first = free.completion_ids[0][0]
    assert first != tok.eos_id and len(free.completion_ids[0]) > 1
    tok.stop_ids = (tok.eos_id, first)  # as a second eos id of generation_config.json would
    stopped = sampler.generate(model, tok, ["12+34="], max_new_tokens=6, greedy=True)
    assert stopped.completion_ids[0] == [first] and stopped.texts == [""]


def test_config_errors_name_the_fields(hf_dir, data, tmp_path):
    with pytest.raises(ConfigError, match="sft.enable=false needs model.hf_assets_path"):
        to_object(compose_root("algo=grpo", "sft.enable=false"))
    with pytest.raises(ConfigError, match="sft.enable=false is invalid with algo=sft"):
        to_object(compose_root("algo=sft", "sft.enable=false", f"model.hf_assets_path={hf_dir}"))
    with pytest.raises(ConfigError, match="task.system_prompt"):
        TaskConfig(system_prompt="be brief")
    from refexp.tasks import build_task

    with pytest.raises(ConfigError, match="task.chat_template=true is invalid"):
        build_task(TaskConfig(chat_template=True, num_train=50, num_eval=10), str(tmp_path))


@pytest.mark.slow
def test_grpo_from_the_pretrained_checkpoint_under_fsdp(hf_dir, data, tmp_path):
    """2 FSDP ranks load the checkpoint and export it; the held-out measurements, split between the ranks
    (odd counts: one rank pads its share), equal one process's at every eval step."""
    # A reward by length: the policy moves (kl/init > 0) and greedy accuracy is not all zeros.
    odd = ("eval.num_prompts=5", "eval.kl_prompts=3", "eval.every=1", "task.reward=tests.helpers.rewards:by_length")
    final = run(_grpo(tmp_path / "run", hf_dir, data, *odd, "parallelism=fsdp", "parallelism.nproc_per_node=2"))
    assert final["step"] == 2
    assert (tmp_path / "run" / "checkpoint" / "hf" / "generation_config.json").is_file()
    run(_grpo(tmp_path / "one", hf_dir, data, *odd))
    two, one = (read_metrics(tmp_path / d) for d in ("run", "one"))
    assert [r["step"] for r in two] == [r["step"] for r in one] == [0, 1, 2]
    for got, want in zip(two, one):
        assert got["kl/init"] == pytest.approx(want["kl/init"], abs=1e-5)
        assert got["eval/accuracy"] == want["eval/accuracy"]
    assert one[-1]["kl/init"] > 1e-6 and one[-1]["eval/accuracy"] > 0  # not a comparison of zeros
