"""Command-line tools installed as console scripts (setup.py): ``palm-score`` (evaluation metrics as the papers
report them), ``palm-prepare`` (raw benchmark formats to source/target line files, and subword encoding) and
``palm-bench`` (speed and memory against fairseq baselines)."""
