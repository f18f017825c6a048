"""What the memory plan (``refexp/cli/memory_plan.py``) knows of a configured job before anything runs: the model's
parameter counts and layer sizes from a meta-device build, and the job's parallel layout."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Shapes:
    params: int
    """P: every parameter of the model."""
    block_params: int
    """Parameters of one transformer block."""
    head_params: int
    """Parameters of torchtitan's last FSDP unit: the final norm and lm_head (with the embedding when tied)."""
    dim: int
    kv_dim: int
    """Width of the keys (= values) of one block: n_kv_heads x head_dim."""
    ffn: int
    n_layers: int
    vocab: int
    q_dim: int = 0
    """Width of the queries (= the attention output wo reads): n_heads x head_dim, which need not be dim (Qwen3-0.6B:
    16 x 128 = 2048 against dim 1024); 0 means dim."""
    n_heads: int = 0
    n_kv_heads: int = 0
    qk_norm: bool = False
    """Queries and keys are RMS-normalised per head before RoPE (Qwen3's q_norm / k_norm)."""

    @property
    def q_width(self) -> int:
        return self.q_dim or self.dim


def model_shapes(model_cfg, parallelism) -> Shapes:
    """Parameter counts and layer sizes of the configured model, from a meta-device build."""
    import torch

    from refexp import titan

    spec = titan.build_model_spec(model_cfg, vocab_size=None, parallelism=parallelism)
    with torch.device("meta"):
        model = spec.model.build()
    dec = titan.unwrap.decoder_of(model)
    block = next(iter(dec.layers.values()))
    attn = block.attention
    dim = dec.tok_embeddings.weight.shape[1]
    q_out = sum(p.shape[0] for n, p in attn.named_parameters() if n.split(".")[-2] in ("wq", "wqkv"))
    kv_dim = _kv_dim(attn, dim, q_out)
    ffn = next(p.shape[0] for n, p in block.named_parameters() if n.endswith("w1.weight"))
    q_dim = next(p.shape[1] for n, p in attn.named_parameters() if n.endswith("wo.weight"))  # wo reads the heads
    head_dim = getattr(attn, "head_dim", None) or q_dim // max(1, getattr(attn, "n_heads", 1) or 1)
    qk_norm = any(n.split(".")[0] in ("q_norm", "k_norm") for n, _ in attn.named_parameters())
    head = {id(p): p for m in (dec.norm, dec.lm_head) for p in m.parameters()}
    if getattr(dec, "enable_weight_tying", False):
        head.update({id(p): p for p in dec.tok_embeddings.parameters()})
    return Shapes(params=sum(p.numel() for p in model.parameters()),
                  block_params=sum(p.numel() for p in block.parameters()),
                  head_params=sum(p.numel() for p in head.values()), dim=dim, kv_dim=kv_dim, ffn=ffn,
                  n_layers=len(dec.layers), vocab=dec.tok_embeddings.weight.shape[0], q_dim=q_dim,
                  n_heads=q_dim // head_dim, n_kv_heads=kv_dim // head_dim, qk_norm=qk_norm)


def _kv_dim(attn, dim: int, q_out: int) -> int:
    """Width of the keys (= values) of one block: wk's rows, or the k/v part of a fused wqkv."""
    for n, p in attn.named_parameters():
        if n.split(".")[-2] == "wk":
            return p.shape[0]
    n_kv, head_dim = getattr(attn, "n_kv_heads", None), getattr(attn, "head_dim", None)
    if n_kv and head_dim:
        return n_kv * head_dim
    return (q_out - dim) // 2 if q_out > dim else dim


def layout(cfg) -> tuple[int, int, int, int]:
    """(world size, replicate, shard, TP degrees) of the planned job: torchrun's WORLD_SIZE when set (several
    nodes), else one node's processes."""
    from refexp.config.model import planned_world_size, resolve_shard_degree

    world = planned_world_size(cfg.parallelism) or cfg.parallelism.nproc_per_node
    if world == 1:
        return 1, 1, 1, 1
    p = cfg.parallelism
    return world, p.data_parallel_replicate_degree, resolve_shard_degree(p, world), p.tensor_parallel_degree


@dataclass
class LoRAShapes:
    """What ``model.lora`` adds to the model: its adapters and what each reference strategy keeps beside them."""

    adapter_params: int
    """Parameters of every adapter: rank x (in + out) per adapted layer (the only ones that train)."""
    delta_params: int
    """in x out per adapted layer: the dense delta an EMA reference keeps (``titan/lora.py``)."""
    targets: list[str]
    """The adapted layers' names (``wqkv``, ``wo``, ...)."""
    layers: int
    """How many layers are adapted."""

    def reference_params(self, reference_state: str) -> int:
        """Parameters of the reference's part (``config.model.LORA_REFERENCE_STATE``): none, a reference adapter, or
        the dense delta."""
        return {"none": 0, "adapter": self.adapter_params, "delta": self.delta_params}[reference_state]


def lora_shapes(model_cfg, parallelism) -> LoRAShapes | None:
    """The adapters of ``model.lora`` (None when it is off); ConfigError for targets the model lacks or a rank too
    large (``titan.lora_targets``)."""
    if not model_cfg.lora.enabled:
        return None
    from refexp import titan

    spec = titan.build_model_spec(model_cfg, vocab_size=None, parallelism=parallelism)
    targets = titan.lora_targets(spec.model, model_cfg.lora)
    r = model_cfg.lora.rank
    return LoRAShapes(adapter_params=sum(r * (n_in + n_out) for _, n_in, n_out in targets),
                      delta_params=sum(n_in * n_out for _, n_in, n_out in targets),
                      targets=sorted({fqn.rsplit(".", 1)[-1] for fqn, _, _ in targets}), layers=len(targets))
