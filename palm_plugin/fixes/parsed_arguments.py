"""Checks of a fairseq command line once it is parsed. Every fairseq command parses in
``fairseq.options.parse_args_and_arch``, after the task, model and criterion have added their options, so the fixes
that check arguments (option_ranges, checkpoint_paths, ...) register their checks here, and one wrapper of it runs
them all. fairseq-hydra-train parses no command line: :mod:`.hydra_config` runs the same checks on its
configuration (:func:`run_checks`)."""
import functools
import sys

# every check registered, by marker, in the order they run after a parse
CHECKS = {}


def run_checks(args, argv):
    """Run every registered check on ``args`` as if parsed from ``argv`` (the flags that count as given)."""
    for check in CHECKS.values():
        check(args, argv)


def _checked(parse):
    @functools.wraps(parse)  # keeps the marks of the fixes that wrapped it before
    def parse_args_and_arch(parser, input_args=None, parse_known=False, suppress_defaults=False, modify_parser=None):
        result = parse(parser, input_args, parse_known, suppress_defaults, modify_parser)
        if not suppress_defaults:  # the pass that leaves defaults out is fairseq's own, before the real one
            run_checks(result[0] if parse_known else result, sys.argv[1:] if input_args is None else list(input_args))
        return result

    parse_args_and_arch.__palm_plugin__ = True
    parse_args_and_arch.__palm_checks__ = True
    return parse_args_and_arch


def check_after_parsing(marker: str, check):
    """Have ``check(args, argv)`` see the namespace of every complete parse and the command line it came from: the
    first call wraps ``parse_args_and_arch`` once, and each registers its check under ``marker``, once (a second
    import of the plugin registers nothing again)."""
    from fairseq import options

    CHECKS.setdefault(marker, check)
    if not getattr(options.parse_args_and_arch, "__palm_checks__", False):
        options.parse_args_and_arch = _checked(options.parse_args_and_arch)
