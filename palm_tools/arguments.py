"""argparse types with a range, for the tools' numeric options: a size or a count of zero, or a share above one,
stops at the command line with the option and the range, not deep inside the run (or, worse, runs)."""
import argparse


def whole_number(low=1):
    """A whole number of at least ``low``."""
    def parse(text):
        value = int(text)  # a ValueError: argparse's own "invalid int value: 'x'"
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}; give a whole number of at least {low}")
        return value
    parse.__name__ = "int"
    return parse


def number_between(low, high, meaning):
    """A number in the open interval (``low``, ``high``); ``meaning`` says what it is, for the error."""
    def parse(text):
        value = float(text)  # a ValueError: argparse's own "invalid float value: 'x'"
        if not low < value < high:
            raise argparse.ArgumentTypeError(f"{value:g} is outside ({low:g}, {high:g}): {meaning}")
        return value
    parse.__name__ = "float"
    return parse
