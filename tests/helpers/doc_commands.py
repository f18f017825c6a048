"""The ``refexp ...`` commands of README.md and docs/*.md, read from their fenced code blocks, and the files those
commands name, made small (tests/test_doc_commands.py).

A command is a line (``\\``-continuations joined, a ``# comment`` dropped, a ``&&`` chain split) whose first word
is ``refexp`` and whose other words are overrides (``key=value``), Hydra's flags (``-m``, ``--cfg job``,
``--config-dir DIR``) or ``...``; an output line such as ``refexp dry run: ...`` or ``refexp: error: ...`` is none.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCKS = ("", "bash", "sh", "shell", "console")
"""The info strings of the fenced blocks read: the unlabelled and the shell ones (python blocks hold no command)."""
FLAGS_WITH_VALUE = {"--cfg", "-c", "--config-dir", "-cd", "--config-name", "-cn", "--config-path", "-cp",
                    "--package", "-p"}


@dataclass(frozen=True)
class DocCommand:
    where: str
    """The file it is written in, relative to the repository root."""
    argv: tuple[str, ...]
    """Its words after ``refexp``, quotes removed as the shell would."""

    @property
    def text(self) -> str:
        """``refexp <argv>``, each word as written without its quotes."""
        return " ".join(("refexp", *self.argv))


def _fenced_blocks(text: str):
    for m in re.finditer(r"^ *```([^\n`]*)\n(.*?)^ *```", text, re.S | re.M):
        if m.group(1).strip() in SHELL_BLOCKS:
            yield m.group(2)


def _is_command_word(words: list[str], i: int) -> bool:
    word = words[i]
    return ("=" in word or word.startswith("-") or word == "..." or (i > 0 and words[i - 1] in FLAGS_WITH_VALUE))


def _chained(words: list[str]) -> list[list[str]]:
    """The commands of a ``a && b; c`` line, each as its words."""
    out: list[list[str]] = [[]]
    for word in words:
        if word in ("&&", "||", ";"):
            out.append([])
        else:
            out[-1].append(word)
    return out


def doc_commands() -> list[DocCommand]:
    """Every distinct ``refexp`` command of ``DOC_FILES``, in file order (the first place one is written)."""
    out: dict[tuple[str, ...], DocCommand] = {}
    for path in DOC_FILES:
        for block in _fenced_blocks(path.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                try:
                    words = shlex.split(line, comments=True)
                except ValueError:  # an output line with an unbalanced quote
                    continue
                for part_words in _chained(words):
                    if part_words[:1] != ["refexp"]:
                        continue
                    argv = part_words[1:]
                    if all(_is_command_word(argv, i) for i in range(len(argv))):
                        out.setdefault(tuple(argv), DocCommand(str(path.relative_to(ROOT)), tuple(argv)))
    return list(out.values())


# ---------------------------------------------------------------- the files the commands name
QWEN3_0_6B = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936,
              "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960, "rope_theta": 1000000,
              "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
"""Qwen3-0.6B's config.json shapes: the docs' ``model.hf_assets_path=qwen3-0.6b`` (its weights are never read)."""
SMOLLM2_135M = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 49152, "hidden_size": 576,
                "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                "num_key_value_heads": 3, "max_position_embeddings": 8192, "rope_theta": 100000,
                "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
"""SmolLM2-135M-Instruct's config.json shapes (docs/own-data.md): what ``model.pretrained=smollm2_135m`` converts
to, standing in for the fetch."""
STAND_INS = {"qwen3-0.6b": QWEN3_0_6B, "models/Qwen3-0.6B": QWEN3_0_6B}
"""Checkpoint dirs the commands name -> the config.json written there beside the tiny Qwen3's tokenizer."""
GSM8K_FILES = ("train.jsonl", "test.jsonl")
GSM8K_FOLDERS = ("gsm8k", "data/gsm8k")
GSM8K_ROWS = 1200
"""Rows of each GSM8K-format file: more than a task's default ``task.num_eval`` (500), which a command without
``task.eval_path`` holds out of its training rows."""
PREFERENCE_FILE = "prefs.jsonl"
PREFERENCE_ROWS = 400
REWARD_MODULE = "mypkg/rewards.py"
REWARD_MODEL_DIR = "path/to/rm"
POLICY_EXPORT = "runs/grpo-none"
EXPERIMENT_FILE = "myconf/experiment/mine.yaml"


def localized(argv: tuple[str, ...]) -> list[str]:
    """``argv`` with the docs' absolute placeholder paths (``/models/...``, ``/data/...``) under the working dir."""
    return [re.sub(r"=/(models|data)/", r"=\1/", word) for word in argv]


def _gsm8k_rows(n: int) -> list[dict]:
    return [{"question": f"Tom has {i % 97} apples and buys {i % 13 + 1} more. How many apples does he have?",
             "answer": f"He has {i % 97} + {i % 13 + 1} = {i % 97 + i % 13 + 1} apples.\n#### {i % 97 + i % 13 + 1}"}
            for i in range(n)]


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _checkpoint_stand_in(path: Path, tokenizer_dir: Path, config: dict) -> None:
    """``config`` as ``path/config.json`` beside ``tokenizer_dir``'s tokenizer files and an empty weights file
    (nothing before the model is built reads the weights)."""
    path.mkdir(parents=True, exist_ok=True)
    for f in tokenizer_dir.iterdir():
        if f.name not in ("config.json", "model.safetensors", "generation_config.json"):
            shutil.copy(f, path / f.name)
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(b"")


def make_files(root: Path, tokenizer_dir: Path, run_model_arch) -> Path:
    """Every file and dir the runnable documented commands name, under ``root`` (their working dir); returns the
    stand-in for ``model.pretrained=smollm2_135m``'s converted dir. ``tokenizer_dir``: the tiny Qwen3 (a BPE
    tokenizer with a ChatML chat template, as SmolLM2's and Qwen3's); ``run_model_arch``: the default model's
    ``Arch``, the shapes of the policy ``rm.policies`` names."""
    import datasets
    import torch
    import transformers

    from refexp.titan.hf_config import write_hf_config

    for name, config in STAND_INS.items():
        _checkpoint_stand_in(root / name, tokenizer_dir, config)
    smollm2 = root / "pretrained" / "smollm2_135m"
    _checkpoint_stand_in(smollm2, tokenizer_dir, SMOLLM2_135M)
    rows = _gsm8k_rows(GSM8K_ROWS)
    for name in GSM8K_FILES:
        _jsonl(root / name, rows)
    for name in GSM8K_FOLDERS:  # a saved DatasetDict, as `datasets.load_dataset(...).save_to_disk(...)` writes
        datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                              "test": datasets.Dataset.from_list(rows[:100])}).save_to_disk(str(root / name))
    _jsonl(root / PREFERENCE_FILE, [{"prompt": f"What is {i} + 1?", "chosen": f" {i + 1}", "rejected": f" {i}"}
                                    for i in range(PREFERENCE_ROWS)])
    module = root / REWARD_MODULE
    module.parent.mkdir(parents=True)
    (module.parent / "__init__.py").write_text("")
    module.write_text("def score(completion: str, answer: str) -> float:\n    return float(answer in completion)\n")
    rm_dir = root / REWARD_MODEL_DIR
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, num_labels=1,
                                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    transformers.LlamaForSequenceClassification(config).save_pretrained(rm_dir)
    tok.save_pretrained(rm_dir)
    policy = root / POLICY_EXPORT
    policy.mkdir(parents=True)
    write_hf_config(str(policy), "llama3", run_model_arch, torch.float32)
    (policy / "model.safetensors").write_bytes(b"")  # its weights are read when it samples, after the checks
    experiment = root / EXPERIMENT_FILE
    experiment.parent.mkdir(parents=True)
    experiment.write_text("# @package _global_\nexperiment_name: mine\n")
    return smollm2
