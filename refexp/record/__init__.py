"""The run record: every file a run leaves in its run dir, with one writer and one reader per file.

``layout`` names the files; ``status`` (``status.json``), ``metrics`` (``metrics.jsonl``), ``samples``
(``samples.jsonl``), ``outcomes`` (``eval_outcomes.jsonl``) and ``resolved_config`` write and read them;
``metric_names`` is the registry of every metric name; ``atomic`` makes writes all-or-nothing. Torch-free:
the report reads a copied sweep dir on a laptop through this package.
"""
