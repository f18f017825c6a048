"""Pure loss functions: tensors in, ``(loss, metrics)`` out; nothing here knows about models, optimizers or
distributed state.

Shapes are in the names (``_BT`` = [batch, completion tokens], ``_B`` / ``_N`` = one value per sequence);
``metrics`` maps ``/``-namespaced names to detached 0-dim tensors, ``loss/total`` among them. The conventions
every function shares, and where the definitions follow TRL 1.16: docs/algorithms.md, "Losses".
"""

from refexp.losses.common import Metrics, sft_loss
from refexp.losses.dispatch import preference_loss
from refexp.losses.grpo import group_advantages, grpo_loss
from refexp.losses.preference import add_nll_term, dpo_loss, nll_only_loss, orpo_loss, simpo_loss

__all__ = ["Metrics", "add_nll_term", "dpo_loss", "group_advantages", "grpo_loss", "nll_only_loss", "orpo_loss",
           "preference_loss", "sft_loss", "simpo_loss"]
