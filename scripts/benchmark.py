#!/usr/bin/env python
"""Same as the ``palm-bench`` console script (palm_plugin/cli/benchmark.py), runnable from a checkout:

    python scripts/benchmark.py --quick
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from palm_plugin.cli.benchmark import main  # noqa: E402

if __name__ == "__main__":
    main()
