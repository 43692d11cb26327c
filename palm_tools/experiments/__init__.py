"""``palm-experiments`` (the papers' comparisons, small: ``make tables``) and ``palm-gpu-check`` (training numerics
and profiles on a card), with the logged subprocess runner both use."""
