"""Checks of a fairseq command line once it is parsed. Every fairseq command parses in
``fairseq.options.parse_args_and_arch``, after the task, model and criterion have added their options, so the fixes
that check arguments (option_ranges, checkpoint_paths) wrap it, each once. fairseq-hydra-train parses no command
line: :mod:`.hydra_config` runs the same checks on its configuration (:func:`run_checks`)."""
import functools
import sys

# every check registered, by marker, in the order they run after a parse
CHECKS = {}


def run_checks(args, argv):
    """Run every registered check on ``args`` as if parsed from ``argv`` (the flags that count as given)."""
    for check in CHECKS.values():
        check(args, argv)


def check_after_parsing(marker: str, check):
    """Wrap ``parse_args_and_arch`` so that ``check(args, argv)`` sees the namespace of every complete parse and the
    command line it came from; idempotent per ``marker`` (an attribute the wrapper carries)."""
    from fairseq import options

    parse = options.parse_args_and_arch
    if getattr(parse, marker, False):
        return
    CHECKS[marker] = check

    @functools.wraps(parse)  # keeps the markers of the fixes that wrapped it before, so none wraps twice
    def parse_args_and_arch(parser, input_args=None, parse_known=False, suppress_defaults=False, modify_parser=None):
        result = parse(parser, input_args, parse_known, suppress_defaults, modify_parser)
        if not suppress_defaults:  # the pass that leaves defaults out is fairseq's own, before the real one
            check(result[0] if parse_known else result, sys.argv[1:] if input_args is None else list(input_args))
        return result

    parse_args_and_arch.__palm_plugin__ = True
    setattr(parse_args_and_arch, marker, True)
    options.parse_args_and_arch = parse_args_and_arch
