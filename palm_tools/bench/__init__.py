"""``palm-bench``: speed and memory of every model beside the fairseq baseline of the same shape, in one process.

:mod:`.cli` drives a run; :mod:`.data` makes the synthetic corpora, :mod:`.models` builds models and batches through
fairseq's APIs, :mod:`.flops` counts the FLOPs of an update, :mod:`.train` and :mod:`.decode` time training and
decoding, :mod:`.pipeline` the data pipeline, and :mod:`.report` writes the markdown, JSON and chart."""
