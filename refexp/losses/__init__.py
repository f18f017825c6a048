"""Pure loss functions: tensors in, ``(loss, metrics)`` out.

Nothing here knows about models, optimizers or distributed state. Shapes are in the names
(``_BT`` = [batch, completion tokens], ``_B`` / ``_N`` = one value per sequence). Masks are bool or
{0, 1}; values at masked positions are zeroed with ``torch.where`` before any arithmetic, so they
reach neither the loss nor the gradient.

Conventions shared by every function:

* ``loss`` is a 0-dim tensor carrying the graph. Half-precision inputs are promoted to float32
  first, so the loss is float32 (or float64 for float64 inputs).
* ``metrics`` maps ``/``-namespaced names to **detached 0-dim tensors** (on the inputs' device), so
  a caller can all-reduce them before calling ``.item()``. ``loss/total`` is always present and
  equals ``loss``.
* Reference log-probs (``ref_*``) and behaviour log-probs (``old_logp``) are constants: they are
  detached here, so no gradient reaches them even if a caller forgot ``no_grad``.

The definitions follow TRL 1.16 (``GRPOTrainer._compute_loss``, ``DPOTrainer`` loss types,
``CPOTrainer`` ``loss_type="simpo"``, ``ORPOTrainer.odds_ratio_loss``); each docstring lists where
it departs from TRL.
"""

from refexp.losses.common import Metrics, sft_loss
from refexp.losses.grpo import ADVANTAGE_SCALES, GRPO_LOSS_AGGS, group_advantages, grpo_loss
from refexp.losses.preference import DPO_LOSS_TYPES, add_nll_term, dpo_loss, nll_only_loss, orpo_loss, simpo_loss

__all__ = ["ADVANTAGE_SCALES", "DPO_LOSS_TYPES", "GRPO_LOSS_AGGS", "Metrics", "add_nll_term", "dpo_loss",
           "group_advantages", "grpo_loss", "nll_only_loss", "orpo_loss", "sft_loss", "simpo_loss"]
