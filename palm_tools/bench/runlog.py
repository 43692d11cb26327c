"""What every part of a ``palm-bench`` run shares: its log lines, the selection ``--only``, and how a failed
configuration is recorded (the run goes on with the others)."""
import datetime
import gc
import sys

import torch


def log(message):
    print(f"[palm-bench {datetime.datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def wanted(args, key):
    return args.only is None or key in args.only


def short_error(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def free_device_memory():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def record_failure(missing, key, where, error):
    """Record a configuration that failed (a model that has not landed, an error or out-of-memory on the device) and
    go on with the others."""
    log(f"{key} {where}: failed: {short_error(error)}")
    missing.append({"key": key, "reason": f"{where}: {short_error(error)}"})
    free_device_memory()
