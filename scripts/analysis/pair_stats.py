"""What the embedded task's DPO preference pairs are: how far rejected is from chosen, and where.

The embedded pairs (refexp/algos/dpo_data.py) are on-policy: chosen = the demonstration (the correct sum),
rejected = the SFT model's first wrong sample of the same prompt. Both are zero-padded 4-digit sums, so a
pair differs in a digit or two and shares the rest. That shape decides what DPO's gradient does: every
token after the first difference is scored in both completions, and when the rejected completion's later
digits are the correct ones for their positions, pushing the rejected completion down pushes correct
digits down too (likelihood displacement, Pal et al. 2024; Razin et al. 2024).

    python scripts/analysis/pair_stats.py [PAIRS_DIR ...]    # default: every stored pair set under $REFEXP_CACHE/pairs

Prints, per pair set, one JSON line: pairs; mean and distribution of the character edit (Hamming) distance
between chosen and rejected; the mean position of the first differing character; the share of pairs whose
completions share their tail after the first difference; and the share of rejected characters *after* the
first wrong one that equal the chosen character at the same position (correct digits the loss pushes
down).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path


def pair_stats(chosen: list[str], rejected: list[str]) -> dict:
    """Statistics of equal-format completion pairs (see the module docstring)."""
    n = len(chosen)
    hamming, first, shared_tail, after_same, after_total = Counter(), [], 0, 0, 0
    for c, r in zip(chosen, rejected):
        width = max(len(c), len(r))
        c, r = c.ljust(width), r.ljust(width)
        diffs = [i for i in range(width) if c[i] != r[i]]
        hamming[len(diffs)] += 1
        if not diffs:
            continue
        f = diffs[0]
        first.append(f)
        tail = range(f + 1, width)
        same = sum(c[i] == r[i] for i in tail)
        after_same += same
        after_total += len(tail)
        shared_tail += bool(tail) and c[-1] == r[-1]
    return {
        "pairs": n,
        "hamming_mean": sum(k * v for k, v in hamming.items()) / max(1, n),
        "hamming_distribution": {str(k): v / max(1, n) for k, v in sorted(hamming.items())},
        "first_difference_mean_position": sum(first) / max(1, len(first)),
        "share_with_shared_last_character": shared_tail / max(1, n),
        "share_of_rejected_chars_after_the_first_difference_that_are_correct": after_same / max(1, after_total),
    }


def main(argv: list[str]) -> int:
    import datasets

    cache = Path(os.environ.get("REFEXP_CACHE", Path.home() / ".cache" / "refexp"))
    dirs = [Path(a) for a in argv] or sorted(p for p in (cache / "pairs").glob("*") if p.is_dir())
    if not dirs:
        print(f"no stored pair sets under {cache / 'pairs'}: run a DPO job on the embedded task first "
              f"(e.g. refexp algo=dpo training.steps=1)", file=sys.stderr)
        return 2
    for d in dirs:
        ds = datasets.load_from_disk(str(d))
        print(json.dumps({"dir": d.name, **pair_stats(ds["chosen"], ds["rejected"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
