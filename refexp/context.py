"""What every stage of a run shares: the validated config, the run dir, the device and process
group, the task, the logger; and how models are built from the config (policy, frozen copies)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from refexp import titan
from refexp.config import RootConfig
from refexp.distributed import DistInfo
from refexp.logging import MetricLogger


@dataclass
class RunContext:
    cfg: RootConfig
    run_dir: Path
    cache_dir: Path
    device: torch.device
    dist: DistInfo
    parallel_dims: object | None
    """torchtitan ParallelDims when world_size > 1, else None."""
    task: object
    """refexp.tasks.Task"""
    logger: MetricLogger

    # ---------------------------------------------------------------- data parallel layout
    @property
    def dp_rank_and_degree(self) -> tuple[int, int]:
        """This rank's index among data-parallel ranks (FSDP shard x replicate), and their number.
        Tensor-parallel peers share a dp index: they process the same rows."""
        pd = self.parallel_dims
        if pd is None:
            return 0, 1
        dp = pd.dp_replicate * pd.dp_shard
        if dp == 1:
            return 0, 1
        mesh = pd.get_mesh("batch") if hasattr(pd, "get_mesh") else pd.world_mesh["dp"]
        return mesh.get_local_rank(), dp

    def local_slice(self, n: int) -> slice:
        """The rows of a global batch of n that this rank processes (n must divide evenly)."""
        r, d = self.dp_rank_and_degree
        if n % d:
            raise ValueError(f"global batch of {n} rows does not divide over {d} data-parallel ranks")
        k = n // d
        return slice(r * k, (r + 1) * k)

    def dp_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum a tensor over the data-parallel ranks (not tensor-parallel peers, which hold the same rows)."""
        r, d = self.dp_rank_and_degree
        if d == 1:
            return t
        import torch.distributed as dist

        pd = self.parallel_dims
        mesh = pd.get_mesh("batch") if hasattr(pd, "get_mesh") else pd.world_mesh["dp"]
        t = t.clone()
        dist.all_reduce(t, group=mesh.get_group())
        return t

    # ---------------------------------------------------------------- models
    def build_model(self, *, trainable: bool, seed: int | None = None, dtype: str | None = None,
                    compile_enable: bool | None = None) -> torch.nn.Module:
        """A model of the configured family/shape with this run's parallelism (weights: fresh init)."""
        cfg = self.cfg
        compile_cfg = cfg.compile
        if compile_enable is not None and compile_enable != compile_cfg.enable:
            from dataclasses import replace

            compile_cfg = replace(compile_cfg, enable=compile_enable)
        model = titan.build_model(
            cfg.model,
            vocab_size=self.task.tokenizer.vocab_size,
            device=self.device,
            dtype=dtype or cfg.training.dtype,
            seed=cfg.training.seed if seed is None else seed,
            mesh=self.parallel_dims,
            parallelism=cfg.parallelism,
            compile_cfg=compile_cfg,
            training_cfg=cfg.training,
            requires_grad=trainable,
        )
        if not trainable:
            model.eval()
        return model

    def build_frozen(self, checkpoint: str | Path, *, dtype: str | None = None,
                     compile_enable: bool | None = None) -> torch.nn.Module:
        """A frozen (no grad, no optimizer state) copy loaded from a checkpoint dir."""
        model = self.build_model(trainable=False, dtype=dtype, compile_enable=compile_enable)
        self.load_weights(model, checkpoint)
        return model

    def load_weights(self, model: torch.nn.Module, checkpoint: str | Path) -> None:
        """Weights from a refexp/DCP checkpoint dir, or from an HF safetensors dir (config.json + *.safetensors)."""
        from refexp.checkpoint import is_hf_dir, load_model_weights

        if is_hf_dir(checkpoint):
            titan.load_hf_weights_(model, self.cfg.model, str(checkpoint))
        else:
            load_model_weights(model, checkpoint)
