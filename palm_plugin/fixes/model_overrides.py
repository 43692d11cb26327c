"""``--model-overrides`` keys that the checkpoint's configuration lacks stop the command, where fairseq drops them.

fairseq-generate, fairseq-interactive and fairseq-validate pass ``--model-overrides "{'key': value}"`` to
``checkpoint_utils.load_model_ensemble_and_task``, whose ``overwrite_args_by_name`` sets only the keys the
checkpoint's configuration has and drops the others without a word: a typo (``'dropuot'``), or an option of another
model (``'decoding_graph'`` for PALM, which has no decoding graph), decodes as if it had not been given.

:func:`install` records the keys of ``--model-overrides`` when a command line is parsed, and wraps fairseq's model
loader so that the first load after it stops, with one line, on a recorded key that the loaded configuration does not
have (:func:`option_names`, which the API's ``from_pretrained`` checks its keywords with too). Only the recorded keys
are checked: fairseq-validate also passes every option of its command line, and the API its own file paths.
"""
import argparse
import ast
import difflib
import functools

from omegaconf import OmegaConf

from palm_plugin.errors import CommandError
from palm_plugin.fixes.parsed_arguments import check_after_parsing

# the --model-overrides keys of the command line last parsed, checked (and forgotten) by the next model load
_command_line_keys = set()


class ModelOverrideError(CommandError):
    """A ``--model-overrides`` key the checkpoint's configuration does not have."""


def option_names(cfg) -> set:
    """Every option name of a loaded configuration, at any depth (fairseq's groups; an old checkpoint's Namespace)."""
    names, nodes = set(), [OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)]
    while nodes:
        node = nodes.pop()
        node = vars(node) if isinstance(node, argparse.Namespace) else node
        if isinstance(node, dict):
            names.update(node)
            nodes.extend(node.values())
    return names


def _record(args, argv):
    _command_line_keys.clear()
    try:
        overrides = ast.literal_eval(getattr(args, "model_overrides", None) or "{}")
    except (ValueError, SyntaxError):
        return  # fairseq's own parse of it fails (or, in fairseq-validate's eval, reads more than a literal)
    if isinstance(overrides, dict):
        _command_line_keys.update(overrides)


def _check_overrides(load_model_ensemble_and_task):
    @functools.wraps(load_model_ensemble_and_task)
    def load(filenames, arg_overrides=None, *args, **kwargs):
        given = {key for key in _command_line_keys if key in (arg_overrides or {})}
        _command_line_keys.clear()  # once: a later load (--lm-path, the API) is not the command line's
        loaded = load_model_ensemble_and_task(filenames, arg_overrides, *args, **kwargs)
        names = option_names(loaded[1])
        unknown = sorted(given - names)
        if unknown:
            task = getattr(getattr(loaded[2], "cfg", None), "_name", None) or type(loaded[2]).__name__
            # a near miss only: 'decoding_graph' is no typo of 'decoding_format'
            close = difflib.get_close_matches(unknown[0], names, n=1, cutoff=0.85)
            raise ModelOverrideError(
                f"--model-overrides {', '.join(map(repr, unknown))}: not an option of {filenames[0]} (task "
                f"{task}, model {type(loaded[0][0]).__name__}), so fairseq would ignore it; "
                + (f"did you mean {close[0]!r}? " if close else "")
                + "leave it out, or check its name (fairseq's options, with _ for -)")
        return loaded

    load.__palm_model_overrides__ = True
    return load


def install():
    """Record ``--model-overrides`` at parsing and check it at loading (idempotent)."""
    from fairseq import checkpoint_utils

    check_after_parsing("__palm_model_overrides__", _record)
    if not getattr(checkpoint_utils.load_model_ensemble_and_task, "__palm_model_overrides__", False):
        checkpoint_utils.load_model_ensemble_and_task = _check_overrides(checkpoint_utils.load_model_ensemble_and_task)
