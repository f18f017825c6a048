"""docs/options.md is generated from the config dataclasses (``python -m refexp.config.docs``): the committed
page matches them, names every field, and each field's meaning is its docstring."""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Literal, Optional, get_type_hints

from refexp.config import GROUP_SCHEMAS, OPTION_SCHEMAS, RootConfig
from refexp.config.docs import PAGE, field_docs, field_table, render

_Choice = Literal["fast", "slow"]


def test_the_committed_options_page_is_up_to_date():
    assert PAGE.read_text() == render(), "docs/options.md is stale: run `python -m refexp.config.docs`"


def test_every_field_of_every_schema_has_a_docstring():
    schemas = [RootConfig, *GROUP_SCHEMAS.values(), *(s for group in OPTION_SCHEMAS.values() for s in group.values())]
    missing = [f"{s.__name__}.{f.name}" for s in schemas for f in fields(s) if f.name not in field_docs(s)]
    assert not missing, f"fields without a docstring under them: {missing}"


def _field_rows(schema: type, prefix: str) -> list[str]:
    """``prefix.field`` of every field; a block inside a group (``model.lora``) by its own fields."""
    hints = get_type_hints(schema)
    return [row for f in fields(schema)
            for row in (_field_rows(hints[f.name], f"{prefix}.{f.name}") if is_dataclass(hints[f.name])
                        else [f"{prefix}.{f.name}"])]


def test_the_page_has_a_row_for_every_field():
    page = render()
    rows = [row for group, schema in GROUP_SCHEMAS.items() for row in _field_rows(schema, group)]
    rows += [f"{group}.{f.name}" for group, options in OPTION_SCHEMAS.items() for schema in options.values()
             for f in fields(schema) if f.name != "name"]
    rows += ["eval.every", "sft.patience", "experiment_name", "dry_run"]
    assert [r for r in rows if f"| `{r}` |" not in page] == []


@dataclass
class _Base:
    kept: int = 1
    """The base's meaning."""
    renamed: str = "a"
    """Overridden below."""
    undocumented: int = 0
    speed: Optional[_Choice] = None
    """How fast; | in a docstring stays inside its cell."""


@dataclass
class _Child(_Base):
    renamed: str = "b"
    """The child's own meaning,
    over two lines."""


def test_field_docs_reads_the_docstring_under_each_field_the_subclass_over_its_base():
    assert field_docs(_Child) == {"kept": "The base's meaning.", "renamed": "The child's own meaning,\nover two lines.",
                                  "speed": "How fast; | in a docstring stays inside its cell."}


def test_a_row_gives_the_type_with_its_choices_the_default_and_the_docstring_on_one_line():
    rows = field_table(_Child, "x", ["renamed", "speed", "undocumented"])
    assert rows[2:] == [
        "| `x.renamed` | `str` | `b` | The child's own meaning, over two lines. |",
        "| `x.speed` | `Optional[Literal['fast', 'slow']]` | `null` | "
        "How fast; \\| in a docstring stays inside its cell. |",
        "| `x.undocumented` | `int` | `0` | (no docstring) |",
    ]
