"""Command-line tools beside the fairseq plugin, installed as console scripts (setup.py), one room each:

- :mod:`.data`: ``palm-data`` (the embedded corpora as fairseq binaries) and ``palm-prepare`` (raw benchmark
  formats to source/target line files, and subword encoding);
- :mod:`.scoring`: ``palm-score`` (evaluation metrics as the papers report them);
- :mod:`.convert`: ``palm-convert`` (released checkpoints to and from the plugin's format);
- :mod:`.bench`: ``palm-bench`` (speed and memory against fairseq baselines);
- :mod:`.experiments`: ``palm-experiments`` (the papers' comparisons) and ``palm-gpu-check``;
- at the top: ``palm-demo``, ``palm-plot`` (training curves) and atomic file writing, which every room uses.

A tool imports fairseq and the plugin only when it needs them: scoring and the readers do not.
"""
