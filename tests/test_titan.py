"""refexp.titan on real torchtitan models, single process on CPU (tiny shapes: seconds in total).

Multi-process checks (FSDP, TP) are in test_titan_distributed.py.
"""

import json

import pytest
import torch
import torch.nn.functional as F

from refexp import titan
from refexp.config import CompileConfig, ConfigError, ModelConfig, ParallelismConfig
from refexp.config.model import LoRAConfig
from refexp.titan.decode_step_plain import PlainStepWeights
from tests.helpers.models import tiny_model_config

pytestmark = pytest.mark.numerics  # tests/README.md: run under other CPU kernels too

V = 16  # the tiny models' vocabulary
FAMILIES = ("llama3", "qwen3")


def build(name: str, seed: int = 0, rope_theta=None, **kwargs):
    cfg = tiny_model_config(name, vocab_size=V, rope_theta=rope_theta)
    return titan.build_model(cfg, vocab_size=V, device="cpu", seed=seed, **kwargs)


def tokens(B: int = 3, T: int = 10, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# --------------------------------------------------------------------------- building


@pytest.mark.parametrize("name", FAMILIES)
def test_build_is_seeded_and_trains(name):
    a, b, c = params(build(name, seed=0)), params(build(name, seed=0)), params(build(name, seed=1))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].numel() > a[k].shape[0])
    model = build(name)
    out = model(tokens())
    assert out.shape == (3, 10, V) and out.dtype == torch.float32
    out.logsumexp(-1).mean().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum() for g in grads) > 0


def test_build_does_not_consume_the_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build("llama3", seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_shapes_follow_the_overrides():
    spec = titan.build_model_spec(tiny_model_config("qwen3", vocab_size=V, ffn_hidden_dim=96), vocab_size=None)
    attn = spec.model.layers[0].attention
    assert (spec.model.dim, len(spec.model.layers), spec.model.vocab_size) == (64, 2, V)
    assert (attn.n_heads, attn.n_kv_heads, attn.head_dim, attn.rope.dim, attn.rope.max_seq_len) == (4, 2, 16, 16, 64)
    assert spec.model.layers[0].feed_forward.w1.out_features == 96
    assert type(attn.inner_attention).__qualname__ == "MaskedSDPA.Config"  # model.attn_backend=sdpa (+ explicit masks)
    # The tokenizer's size is the vocabulary when model.vocab_size is null.
    assert titan.build_model_spec(tiny_model_config("llama3", vocab_size=None), vocab_size=40).model.vocab_size == 40


@pytest.mark.parametrize("name", FAMILIES)
def test_rope_theta_overrides_the_flavor_base_and_the_rotation(name):
    flavor = titan.build_model_spec(tiny_model_config(name, vocab_size=V), vocab_size=None).model
    spec = titan.build_model_spec(tiny_model_config(name, vocab_size=V, rope_theta=100.0), vocab_size=None).model
    assert flavor.layers[0].attention.rope.theta != 100.0
    assert all(layer.attention.rope.theta == 100.0 for layer in spec.layers)
    # The base reaches the built rotation: same weights, other logits.
    default, other = build(name), build(name, rope_theta=100.0)
    other.load_state_dict(default.state_dict())
    assert not torch.allclose(default(tokens()), other(tokens()))
    with pytest.raises(ConfigError, match="model.rope_theta"):
        ModelConfig(rope_theta=0.5)


def test_unshrunk_flavor_is_initialised_like_torchtitan_registry():
    """Rebuilding the config from the flavor's hyper-parameters changes nothing torchtitan would build."""
    from torchtitan.models.common import ScaledDotProductAttention
    from torchtitan.models.llama3 import model_registry

    cfg = ModelConfig(name="llama3", flavor="debugmodel", n_layers=2)  # fewer layers keeps it fast
    mine = titan.build_model(cfg, vocab_size=None, device="cpu", seed=3)
    reference = model_registry("debugmodel").model
    reference.layers = reference.layers[:2]
    for layer in reference.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    with torch.device("meta"):
        theirs = reference.build()
    theirs.to_empty(device="cpu")
    torch.manual_seed(3)
    theirs.init_states(buffer_device=torch.device("cpu"))
    a, b = params(mine), params(theirs)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_frozen_copy_has_no_grad():
    model = build("llama3", requires_grad=False)
    assert not any(p.requires_grad for p in model.parameters()) and not model.training


def test_count_parameters_counts_tied_weights_once():
    model = build("qwen3")  # qwen3 debugmodel ties embeddings
    unique = {id(p): p.numel() for p in model.parameters()}
    assert titan.count_parameters(model) == titan.count_parameters(model, local=False) == sum(unique.values())
    assert model.tok_embeddings.weight is model.lm_head.weight


# --------------------------------------------------------------------------- config errors


def test_tp_degree_that_does_not_divide_heads_is_a_config_error():
    with pytest.raises(ConfigError, match="tensor_parallel_degree=3"):
        titan.build_model_spec(tiny_model_config("llama3", vocab_size=V), vocab_size=V,
                               parallelism=ParallelismConfig(tensor_parallel_degree=3))
    with pytest.raises(ConfigError, match="tensor_parallel_degree=4.*n_kv_heads=2"):
        titan.build_model_spec(tiny_model_config("llama3", vocab_size=V), vocab_size=V,
                               parallelism=ParallelismConfig(tensor_parallel_degree=4))


def test_unknown_flavor_is_a_config_error_listing_valid_flavors():
    with pytest.raises(ConfigError, match=r"model\.flavor='tiny'.*debugmodel.*8B") as info:
        titan.build_model_spec(tiny_model_config("llama3", vocab_size=V, flavor="tiny"), vocab_size=V)
    with pytest.raises(ConfigError, match=r"model\.flavor='debugmodel_moe'.*mixture-of-experts"):
        titan.build_model_spec(tiny_model_config("qwen3", vocab_size=V, flavor="debugmodel_moe"), vocab_size=V)
    assert "debugmodel_moe" not in str(info.value)


@pytest.mark.parametrize(
    "overrides, field",
    [(dict(n_kv_heads=3), "model.n_kv_heads"), (dict(dim=72, n_heads=8), "model.dim"),
     (dict(vocab_size=8), "model.vocab_size")],
)
def test_impossible_shapes_are_config_errors(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        titan.build_model_spec(tiny_model_config("llama3", **{"vocab_size": V, **overrides}), vocab_size=V)


def test_parallel_degrees_must_match_the_world_size():
    with pytest.raises(ConfigError, match="tensor_parallel_degree=2.*world size 3"):
        titan.make_parallel_dims(ParallelismConfig(tensor_parallel_degree=2), 3, "cpu")
    with pytest.raises(ConfigError, match="data_parallel_shard_degree=2.*world size 8"):
        titan.make_parallel_dims(ParallelismConfig(data_parallel_shard_degree=2, tensor_parallel_degree=2), 8, "cpu")
    with pytest.raises(ConfigError, match="spmd_backend"):
        titan.make_parallel_dims(ParallelismConfig(spmd_backend="spmd_types"), 2, "cpu")
    dims = titan.make_parallel_dims(ParallelismConfig(tensor_parallel_degree=2), 4, "cpu")
    assert (dims.dp_shard, dims.tp, dims.world_size) == (2, 2, 4)
    # A mesh and a config that disagree: caught before anything needs a process group.
    with pytest.raises(ConfigError, match=r"parallelism \(dp_shard=4\).*mesh \(dp_shard=2\)"):
        build("llama3", mesh=dims, parallelism=ParallelismConfig(data_parallel_shard_degree=4))


def test_resolve_device():
    assert titan.resolve_device("cpu") == torch.device("cpu")
    assert titan.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="training.device"):
        titan.resolve_device("tpu")


def test_prepare_torchtitan_points_device_type_at_cpu():
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.tools.utils as utils

    titan.prepare_torchtitan("cpu")
    titan.prepare_torchtitan("cpu")  # idempotent
    assert utils.device_type == parallel_dims.device_type == "cpu" and utils.device_module is torch.cpu


# --------------------------------------------------------------------------- log-probs


@pytest.mark.parametrize("name", FAMILIES)
def test_token_logprobs_equal_log_softmax_of_the_forward(name):
    model, x = build(name), tokens()
    with torch.no_grad():
        logp_BTV = F.log_softmax(model(x).double() / 0.7, dim=-1)[:, :-1]
    want = logp_BTV.gather(-1, x[:, 1:, None])[..., 0]
    want_entropy = -(logp_BTV.exp() * logp_BTV).sum(-1)
    got, entropy = titan.token_logprobs(model, x, temperature=0.7, with_entropy=True)
    assert got.shape == (3, 9) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy.double(), want_entropy, atol=1e-5, rtol=0)
    plain = titan.token_logprobs(model, x)
    from_logits = torch.log_softmax(titan.logits(model, x), -1)[:, :-1].gather(-1, x[:, 1:, None])[..., 0]
    torch.testing.assert_close(plain, from_logits)
    plain.sum().backward()  # differentiable: the policy's log-probs train it
    assert model.lm_head.weight.grad is not None


# --------------------------------------------------------------------------- KV-cache decoding


@pytest.mark.parametrize("path", ["plain", "modules", "static"])
@pytest.mark.parametrize("name", FAMILIES)
def test_kv_cache_decoding_equals_the_full_forward_per_row(name, path):
    """Left-padded rows of different lengths, greedy for 5 steps: every step's logits equal an
    unpadded forward of that row alone, on the one-token step over plain weights (decode_step_plain.py),
    on the sub-modules' path (what TP decodes with) and on the fixed-shape step (rollout.static_decode)."""
    model = build(name, requires_grad=False)
    lens = torch.tensor([5, 3, 1])
    rows = [torch.randint(0, V, (int(n),), generator=torch.Generator().manual_seed(i)) for i, n in enumerate(lens)]
    prompt = torch.zeros(3, 5, dtype=torch.long)
    for b, row in enumerate(rows):
        prompt[b, 5 - len(row):] = row
    out, state = titan.prefill(model, prompt, lens, max_new_tokens=5, static=path == "static")
    assert state.plain is not None  # a single-process model's weights are plain tensors
    if path == "modules":
        state.plain = None
    for _ in range(5):
        assert out.shape == (3, V) and out.dtype == torch.float32
        for b, row in enumerate(rows):
            torch.testing.assert_close(out[b], titan.logits(model, row[None])[0, -1], atol=1e-5, rtol=0)
        nxt = out.argmax(-1)
        rows = [torch.cat([row, nxt[b : b + 1]]) for b, row in enumerate(rows)]
        out, state = titan.decode_step(model, nxt, state)
    assert state.filled == 10
    assert state.key_bufs[0][:3, :, :state.filled].shape == (3, 2, 10, 16)  # [B, n_kv, L + 5, hd]
    if path == "static":  # the rows padded to the bucket's 8, the capacity L + max_new_tokens
        assert state.key_bufs[0].shape == (8, 2, 10, 16)
    if path != "static":  # the fixed-shape step reads whole buffers and leaves the prefill's views as they were
        assert state.keys[0].shape == (3, 2, 10, 16)
    titan.finish_decode(state)


LORA_EVERY_TARGET = {"llama3": ["wqkv", "wo", "w1", "w2", "w3", "lm_head"],
                     "qwen3": None}  # qwen3's debug output layer is tied to the embedding: the blocks' layers


def build_lora(name: str, targets, reference_state: str = "adapter"):
    """A tiny LoRA model (rank 4, alpha 8: a scale of 2, so that a scale left out shows) whose adapters and
    reference adapter are far from their start (B != 0)."""
    model = build(name, lora=LoRAConfig(rank=4, alpha=8, target_modules=targets), lora_reference=reference_state)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in titan.lora.adapted_modules(model).values():
            for p in m.parameters(recurse=True):
                if p is not m.weight:  # lora_a/b and the reference parts
                    p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    return model


def greedy_decode(model, path: str, steps: int = 6, fuse_ffn: bool = True):
    """Left-padded rows of different lengths decoded greedily on ``path`` (``plain``: the one-token step,
    ``modules``: the sub-modules' forwards); every step's logits [3, V] and the tokens [3, steps]."""
    lens = torch.tensor([5, 3, 1])
    prompt = torch.zeros(3, 5, dtype=torch.long)
    for b, n in enumerate(lens.tolist()):
        prompt[b, 5 - n:] = torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(b))
    out, state = titan.prefill(model, prompt, lens, max_new_tokens=steps)
    if path == "modules":
        state.plain = None
    elif not fuse_ffn:
        state.plain = PlainStepWeights.of(titan.unwrap.decoder_of(model), fuse_ffn=False)
    plain = state.plain
    logits, picked = [], []
    for _ in range(steps):
        nxt = out.argmax(-1)
        picked.append(nxt)
        out, state = titan.decode_step(model, nxt, state)
        logits.append(out)
    titan.finish_decode(state)
    return logits, torch.stack(picked, 1), plain


@pytest.mark.parametrize("view, fuse_ffn, targets", [
    ("policy", True, "every"), ("policy", False, "every"), ("base", True, "every"), ("reference", True, "every"),
    ("policy", True, ["w3", "wo"]),  # one of the fused FFN pair adapted
])
@pytest.mark.parametrize("name", FAMILIES)
def test_lora_plain_decoding_equals_the_module_path_in_the_view_decoded(name, view, fuse_ffn, targets):
    """A LoRA model (rank 4, non-zero adapters) decodes on the one-token step in the view it is in: every step's
    logits equal the sub-modules' forwards (torchtitan's LoRA layers) and the greedy tokens are the same; the
    adapters are on in the policy view (its logits are not the base's), the reference adapter in the reference
    view, and none in the base view."""
    model = build_lora(name, LORA_EVERY_TARGET[name] if targets == "every" else targets)
    with titan.lora_view(model, view):
        plain_logits, plain_tokens, plain = greedy_decode(model, "plain", fuse_ffn=fuse_ffn)
        module_logits, module_tokens, _ = greedy_decode(model, "modules")
    assert plain is not None and plain.adapted == (view != "base")  # the plain step ran
    for a, b in zip(plain_logits, module_logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert torch.equal(plain_tokens, module_tokens)
    if view != "base":
        with titan.lora_view(model, "base"):
            base_logits, _, _ = greedy_decode(model, "modules")
        assert not torch.allclose(plain_logits[0], base_logits[0], atol=1e-3)


def test_lora_views_the_plain_step_does_not_take_fall_back():
    """The reference view of a dense EMA delta decodes on the module path; the fixed-shape step refuses adapters."""
    model = build_lora("llama3", None, reference_state="delta")
    decoder = titan.unwrap.decoder_of(model)
    with titan.lora_view(model, "reference"):
        assert PlainStepWeights.of(decoder) is None
    assert PlainStepWeights.of(decoder).adapted
    with pytest.raises(ValueError, match="does not decode LoRA adapters"):
        titan.prefill(model, torch.ones(1, 3, dtype=torch.long), torch.tensor([3]), max_new_tokens=2, static=True)


# --------------------------------------------------------------------------- weights


@pytest.mark.parametrize("name", FAMILIES)
def test_lerp_weights(name):
    dst, src = build(name, seed=0), build(name, seed=1)
    before, source = params(dst), params(src)
    titan.lerp_weights_(dst, src, 0.3)
    for n, p in dst.named_parameters():
        torch.testing.assert_close(p, 0.3 * source[n] + 0.7 * before[n], atol=1e-6, rtol=0)  # float32 rounding
    titan.lerp_weights_(dst, src, 1.0)
    assert all(torch.equal(p, source[n]) for n, p in dst.named_parameters())


def test_lerp_maps_wrapper_names_and_checks_layouts():
    dst, src = build("llama3", seed=0), torch.compile(build("llama3", seed=1))  # src names gain "_orig_mod."
    titan.lerp_weights_(dst, src, 1.0)
    assert torch.equal(dst.lm_head.weight, src._orig_mod.lm_head.weight)
    wider = titan.build_model(tiny_model_config("llama3", vocab_size=V, ffn_hidden_dim=96), vocab_size=V, device="cpu")
    with pytest.raises(AssertionError, match="same architecture and parallelism layout"):
        titan.lerp_weights_(dst, wider, 0.5)


def test_a_host_copy_of_the_shards_restores_the_weights():
    model = build("qwen3")
    copies = titan.copy_shards_to_host(model)
    saved = params(model)
    titan.lerp_weights_(model, build("qwen3", seed=1), 1.0)
    assert any(not torch.equal(p, saved[n]) for n, p in model.named_parameters())
    titan.restore_shards_(model, copies)
    assert all(torch.equal(p, saved[n]) for n, p in model.named_parameters())
    assert all(c.device.type == "cpu" and c.data_ptr() != p.data_ptr() for c, p in zip(copies, model.parameters()))


# --------------------------------------------------------------------------- HF weights


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


def make_hf_model(transformers, name: str):
    """A tiny transformers model of the kind torchtitan's `name` adapter converts (GQA, llama3-style
    RoPE scaling for llama; QK-norm and tied embeddings for qwen3); weights with std 0.2 so that the
    logits are far from uniform."""
    torch.manual_seed(0)
    common = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=32,
                  intermediate_size=128, initializer_range=0.2, rms_norm_eps=1e-6)
    if name == "llama3":
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
        config = transformers.LlamaConfig(**common, rope_parameters=rope, max_position_embeddings=8192)
        return transformers.LlamaForCausalLM(config).eval()
    config = transformers.Qwen3Config(**common, head_dim=16, tie_word_embeddings=True, max_position_embeddings=256)
    return transformers.Qwen3ForCausalLM(config).eval()


def hf_logprobs(hf_model, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf_model(x).logits.float(), -1)[:, :-1].gather(-1, x[:, 1:, None])[..., 0]


@pytest.mark.parametrize("name", FAMILIES)
def test_hf_weights_give_transformers_logprobs_and_export_round_trips(transformers, tmp_path, name):
    hf_model = make_hf_model(transformers, name)
    hf_model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    cfg = ModelConfig(flavor="debugmodel", max_seq_len=64, **titan.model_cfg_overrides_from_hf(str(tmp_path / "hf")))
    assert cfg.name == name and cfg.vocab_size == 32
    model = titan.build_model(cfg, vocab_size=None, device="cpu", seed=9)
    titan.load_hf_weights_(model, cfg, str(tmp_path / "hf"))
    x = torch.randint(0, 32, (3, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(titan.token_logprobs(model, x), hf_logprobs(hf_model, x), atol=1e-4, rtol=0)

    titan.export_hf(model, cfg, str(tmp_path / "out"))
    exported = json.loads((tmp_path / "out" / "config.json").read_text())
    assert exported["tie_word_embeddings"] == (name == "qwen3")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(x).logits, hf_model(x).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", FAMILIES)
def test_export_past_the_shard_size_is_an_indexed_set_both_loaders_read(transformers, tmp_path, name):
    """A tiny ``max_shard_bytes`` splits the export into model-0000i-of-0000N files with transformers'
    index (every tensor in exactly one file, total_size its bytes); transformers and load_hf_weights_
    read it back to the same logits."""
    from safetensors import safe_open

    hf_model = make_hf_model(transformers, name)
    hf_model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    cfg = ModelConfig(flavor="debugmodel", max_seq_len=64, **titan.model_cfg_overrides_from_hf(str(tmp_path / "hf")))
    model = titan.build_model(cfg, vocab_size=None, device="cpu", seed=9)
    titan.load_hf_weights_(model, cfg, str(tmp_path / "hf"))
    out = tmp_path / "out"
    titan.export_hf(model, cfg, str(out))  # fits: one file, no index ...
    assert (out / "model.safetensors").is_file() and not (out / "model.safetensors.index.json").exists()
    titan.export_hf(model, cfg, str(out), max_shard_bytes=40_000)  # ... then over the limit, into the same dir

    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted({*index["weight_map"].values()})
    assert len(files) > 2 and files == sorted(p.name for p in out.glob("*.safetensors"))
    assert all(f.endswith(f"-of-{len(files):05d}.safetensors") for f in files)
    stored, total = {}, 0
    for f in files:
        with safe_open(out / f, "pt") as st:
            for k in st.keys():
                assert k not in stored, f"{k} in two files"
                stored[k] = f
                total += st.get_tensor(k).numel() * 4
    assert stored == index["weight_map"] and index["metadata"]["total_size"] == total
    x = torch.randint(0, 32, (3, 12), generator=torch.Generator().manual_seed(4))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    again = titan.build_model(cfg, vocab_size=None, device="cpu", seed=3)
    titan.load_weights(again, cfg, out)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(x).logits, hf_model(x).logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(titan.logits(again, x), titan.logits(model, x), atol=0, rtol=0)


def test_hf_config_decides_the_shapes(transformers, tmp_path):
    make_hf_model(transformers, "llama3").save_pretrained(tmp_path, safe_serialization=True)
    spec = titan.build_model_spec(ModelConfig(name="llama3", hf_assets_path=str(tmp_path)), vocab_size=20)
    attn = spec.model.layers[0].attention
    assert (spec.model.dim, spec.model.vocab_size, attn.n_kv_heads, spec.model.norm.eps) == (64, 32, 2, 1e-6)
    assert (attn.rope.scaling, attn.rope.theta, attn.rope.max_seq_len) == ("llama", 500000.0, 8192)
    with pytest.raises(ConfigError, match="model.dim=128"):
        titan.build_model_spec(ModelConfig(name="llama3", dim=128, hf_assets_path=str(tmp_path)), vocab_size=None)
    with pytest.raises(ConfigError, match="model.name='qwen3'"):
        titan.build_model_spec(ModelConfig(name="qwen3", hf_assets_path=str(tmp_path)), vocab_size=None)
    with pytest.raises(ConfigError, match="model.rope_theta=10000.0 is invalid.*says 500000"):
        titan.build_model_spec(ModelConfig(name="llama3", rope_theta=10000.0, hf_assets_path=str(tmp_path)),
                               vocab_size=None)
    with pytest.raises(ConfigError, match="tokenizer has 40 tokens"):
        titan.build_model_spec(ModelConfig(name="llama3", hf_assets_path=str(tmp_path)), vocab_size=40)


# --------------------------------------------------------------------------- compile (slow: inductor)


@pytest.mark.slow
def test_per_block_compile_matches_eager():
    eager = build("llama3")
    compiled = build("llama3", compile_cfg=CompileConfig(enable=True))
    assert all(block._compiled_call_impl is not None for block in compiled.layers.values())
    x = tokens()
    torch.testing.assert_close(titan.token_logprobs(compiled, x), titan.token_logprobs(eager, x), atol=2e-5, rtol=0)
