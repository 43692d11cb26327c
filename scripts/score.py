"""The palm-score command line (palm_plugin/cli/score.py) for a checkout without `pip install -e .`."""
from palm_plugin.cli.score import main
raise SystemExit(main())
