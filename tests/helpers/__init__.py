"""What tests share: ``configs`` (composing the config, the tiny runs' overrides), ``runs`` (running refexp
in subprocesses, reading a run's files), ``models`` (tiny model configs), ``tiny_qwen3`` (a tiny HF
checkpoint), ``wandb_records`` (what W&B received), ``grad_recording`` / ``engine_recording`` (a GRPO
update's gradients; the training rollouts, and engine log-probs shifted by a known amount), ``rewards`` (rewards
named by ``task.reward=``) and ``titan_dist_worker`` (the torchrun worker of test_titan_distributed.py).

Imports nothing itself: the torchrun worker imports this package and needs no Hydra.
"""
