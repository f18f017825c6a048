"""GSM8K-format data (Cobbe et al. 2021): ``question`` + ``answer`` columns (names configurable), where
the answer is a worked solution whose last line is ``#### <number>``; any source ``files.load_table``
opens (local file or folder, Hub id).

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
_EXPECTED = "GSM8K columns {q} (non-empty text) and {a} (a solution ending in '#### <number>')"


def load_gsm8k(path: str, *, split: Optional[str] = None, config: Optional[str] = None,
               question_column: str = "question", answer_column: str = "answer",
               cache_dir: Optional[str] = None) -> datasets.Dataset:
    """``prompt``/``completion``/``answer`` rows of GSM8K-format data (see ``files.load_table`` for
    ``split``/``config``); a malformed row raises ConfigError naming the source, the row index and
    what was expected."""
    ds = load_table(path, split=split, config=config, cache_dir=cache_dir)
    q, a = question_column, answer_column
    require_columns(ds, path, (q, a), _EXPECTED.format(q=q, a=a))

    def convert(row: dict, index: int) -> dict:
        question, solution = row[q], row[a]
        if not isinstance(question, str) or not question.strip():
            raise ConfigError(f"{path}: row {index}: {q} is {question!r}; expected non-empty text")
        if not isinstance(solution, str) or "####" not in solution:
            raise ConfigError(f"{path}: row {index}: {a} {_clip(solution)!r} has no '####'; expected "
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
