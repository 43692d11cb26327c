"""Command-line tools installed as console scripts: ``palm-score`` (evaluation metrics as the papers report them)
and ``palm-prepare`` (raw benchmark formats to source/target line files)."""
