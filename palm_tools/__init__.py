"""Command-line tools beside the fairseq plugin, installed as console scripts (setup.py).

``palm-score`` (evaluation metrics as the papers report them), ``palm-prepare`` (raw benchmark formats to
source/target line files, and subword encoding), ``palm-data`` (the embedded corpora as fairseq binaries),
``palm-convert`` (released checkpoints to and from the plugin's format), ``palm-bench`` (speed and memory against
fairseq baselines) and ``palm-demo``. A tool imports fairseq and the plugin only when it needs them: scoring and
the readers do not.
"""
