"""``palm-experiments`` (the papers' comparisons, small: ``make tables``) and ``palm-gpu-check`` (training numerics
and profiles on a card).

palm-experiments: :mod:`.scale` (sizes, budgets, presets), :mod:`.rows` (the experiments, their rows and
pre-trainings), :mod:`.plan` (every run as fairseq command lines), :mod:`.prepare` (the downstream data),
:mod:`.execute` (running the plan), :mod:`.report` (tables, markdown, chart), :mod:`.cli` (the command line).
palm-gpu-check: :mod:`.gpu_training` (precision curves and verdicts), :mod:`.gpu_profile` (torch.profiler runs),
:mod:`.gpu_check` (pytest numerics, the report, the command line). Both run tools through :mod:`.logged_run`."""
