"""A run's ``.hydra/config.yaml`` resolved the way a report may: its node interpolations (``${training.steps}``,
``step_${training.seed}``) are followed, a resolver call (``${oc.env:SECRET}``, ``${hydra:runtime.output_dir}``,
``${now:...}``, refexp's own) never runs.

A report reads files it did not write (a copied sweep, a committed ``runs.tar.xz``), and what it resolves it prints in
report.md, report.html and summary.json: a resolver would read the machine the report runs on (an environment
variable, a file) into them. So every string that calls a resolver anywhere is kept as the text it is, escaped for
OmegaConf (``\\${`` is a literal ``${``), and a node that interpolates it reads that text.
"""

from __future__ import annotations

import re
from typing import Any

from omegaconf import OmegaConf, grammar_parser
from omegaconf.errors import GrammarParseError, OmegaConfBaseException
from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser

_INTERPOLATION_START = re.compile(r"(\\*)\$\{")


def _calls_a_resolver(text: str) -> bool:
    """Whether ``text`` holds a resolver call (``${name:...}``) anywhere, nested ones too; text OmegaConf cannot
    parse counts as one (it is kept as written)."""
    try:
        tree = grammar_parser.parse(text)
    except GrammarParseError:  # malformed interpolation: OmegaConf would not resolve it either
        return True
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, OmegaConfGrammarParser.InterpolationResolverContext):
            return True
        stack.extend(getattr(node, "children", None) or [])
    return False


def _literal(text: str) -> str:
    """``text`` escaped so that OmegaConf reads it back unchanged: k backslashes before ``${`` become 2k + 1 (an even
    run halves, an odd one ends in the escape of ``${``)."""
    return _INTERPOLATION_START.sub(lambda m: "\\" * (2 * len(m.group(1)) + 1) + "${", text)


def _without_resolvers(node: Any) -> Any:
    """``node`` (plain YAML: dicts, lists, scalars) with every string that calls a resolver made literal."""
    if isinstance(node, dict):
        return {k: _without_resolvers(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_without_resolvers(v) for v in node]
    if isinstance(node, str) and "${" in node and _calls_a_resolver(node):
        return _literal(node)
    return node


def resolve_interpolations(raw: dict) -> dict:
    """``raw`` (a parsed config.yaml) with its node interpolations resolved and no resolver run; ``raw`` itself when
    an interpolation cannot be followed (a missing key: the unresolved text still names the run's settings)."""
    try:
        out = OmegaConf.to_container(OmegaConf.create(_without_resolvers(raw)), resolve=True)
    except (OmegaConfBaseException, ValueError, TypeError):  # a missing key, a cycle, a key OmegaConf refuses
        return raw
    return out if isinstance(out, dict) else raw
