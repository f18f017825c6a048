"""GSM8K-format data (Cobbe et al. 2021) from local files: ``question`` + ``answer``, where the answer
is a worked solution whose last line is ``#### <number>``.

Output columns:
- ``prompt``: ``"Question: <question>\\nAnswer:"``
- ``completion``: ``" " + <worked solution>`` (``#### N`` included, so SFT teaches the final-answer
  marker the reward looks for)
- ``answer``: the number after ``####``, commas removed (``"1234"``)

The space opens the completion rather than closing the prompt because BPE tokenizers attach a
space to the word after it: a prompt ending in a space would end in a lone-space token the model
never sees before a word, and prompt/completion encoded separately would not match the text.
"""

from __future__ import annotations

import re
from typing import Optional

import datasets

from refexp.config import ConfigError
from refexp.tasks.files import load_table, require_columns

_FINAL = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
_EXPECTED = "GSM8K columns question (non-empty text) and answer (a solution ending in '#### <number>')"


def load_gsm8k(path: str, *, cache_dir: Optional[str] = None) -> datasets.Dataset:
    """``prompt``/``completion``/``answer`` rows of a GSM8K-format file (see ``files.load_table``);
    a malformed row raises ConfigError naming the file, the row index and what was expected."""
    ds = load_table(path, cache_dir=cache_dir)
    require_columns(ds, path, ("question", "answer"), _EXPECTED)

    def convert(row: dict, index: int) -> dict:
        question, solution = row["question"], row["answer"]
        if not isinstance(question, str) or not question.strip():
            raise ConfigError(f"{path}: row {index}: question is {question!r}; expected non-empty text")
        if not isinstance(solution, str) or "####" not in solution:
            raise ConfigError(f"{path}: row {index}: answer {_clip(solution)!r} has no '####'; expected "
                              f"a worked solution ending in '#### <number>'")
        final = solution.rsplit("####", 1)[1].strip().replace(",", "")
        if not _FINAL.fullmatch(final):
            raise ConfigError(f"{path}: row {index}: the final answer after '####' is {final!r}; "
                              f"expected a number such as 72 or 1,234")
        return {
            "prompt": f"Question: {question.strip()}\nAnswer:",
            "completion": " " + solution.strip(),
            "answer": final,
        }

    # keep_in_memory: no cache file is written next to the user's data (a saved dir may be read-only).
    ds = ds.map(convert, with_indices=True, remove_columns=ds.column_names, keep_in_memory=True)
    return ds.select_columns(["prompt", "completion", "answer"])  # map keeps reused names first


def _clip(value, n: int = 80):
    return value[:n] + "..." if isinstance(value, str) and len(value) > n else value
