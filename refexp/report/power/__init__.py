"""The power plan (``refexp-report --plan EXPERIMENT --pilot PILOT``): ``experiment`` (the design an experiment file
declares), ``pilot`` (variance components from a pilot sweep or summary.json, whose fields ``pilot_summary``
checks), ``detectable`` (the smallest difference a design detects), ``plan`` (the plan's text). A room of its own:
it reads the report's rooms (reading, statistics) and no report imports it."""
