"""``--help`` that lists the options of the task, model and criterion named on the command line.

fairseq parses a command line twice: once to learn ``--task``, ``--arch`` and ``--criterion``, then again after
adding their options to the parser. ``--help`` acts during the first parse, so ``fairseq-train --task pmlm --help``
printed none of the task's options (nor those of fairseq's own tasks). :func:`install` makes every fairseq command
parse without ``--help`` first, so that the options are added, then print the completed parser's help. DATA may
be left out when asking for help.
"""
import sys

HELP = ("-h", "--help")


def install():
    """Patch ``fairseq.options.parse_args_and_arch`` (idempotent)."""
    from fairseq import options

    parse = options.parse_args_and_arch
    if getattr(parse, "__palm_plugin__", False):
        return

    def parse_args_and_arch(parser, input_args=None, parse_known=False, suppress_defaults=False, modify_parser=None):
        arguments = sys.argv[1:] if input_args is None else list(input_args)
        if not any(a in HELP for a in arguments):
            return parse(parser, input_args, parse_known, suppress_defaults, modify_parser)
        relaxed = []

        def help_only(parser):  # fairseq calls this once all options are added, before its last parse
            if modify_parser is not None:
                modify_parser(parser)
            for action in parser._actions:  # DATA is not required while only the help is wanted
                if not action.option_strings and action.nargs is None:
                    action.nargs = "?"
                    relaxed.append(action)

        parse(parser, [a for a in arguments if a not in HELP], True, suppress_defaults, help_only)
        for action in relaxed:
            action.nargs = None
        parser.print_help()
        sys.exit(0)

    parse_args_and_arch.__palm_plugin__ = True
    options.parse_args_and_arch = parse_args_and_arch
