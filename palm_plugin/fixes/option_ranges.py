"""Numeric options out of their range, stopped at the command line instead of training on them.

fairseq checks the type of an option, not its range: ``--label-smoothing 1.5`` trains (the data's nll rises while
the logged loss falls), ``--mask-prob 0`` builds batches with nothing to predict, ``--max-tokens 0`` or ``--beam 0``
end in a traceback deep inside batching or search. :func:`install` wraps ``fairseq.options.parse_args_and_arch``
(every fairseq command parses there) and checks each option of :data:`RANGES` the command has, whichever task,
criterion or model defines it (fairseq's ``label_smoothed_cross_entropy`` as the plugin's ``unilm_cloze``), and
stops with the option, its range and why as the last line of output. It also stops on options that contradict each
other (fairseq takes both and one is ignored, or the run fails deep inside): ``--nbest`` above ``--beam``,
``--no-copy`` with ``--copy-attention-dim``, ``--reinit-encoder`` with no checkpoint to load, ``--fp16`` on the CPU.
"""
import ast
import math

from palm_plugin.errors import CommandError
from palm_plugin.fixes.parsed_arguments import check_after_parsing

# option -> (low, low included, high, high included, what the range means)
SHARE = (0.0, True, 1.0, False, "a probability")
RATE = (0.0, False, 1.0, True, "a share of the tokens (0 would leave nothing to predict)")
COUNT = (1, True, math.inf, False, "a size or a count")
RANGES = {
    "label_smoothing": (0.0, True, 1.0, False, "the share of probability moved off the true token (UniLM: 0.1); at "
                                               "1 or more the loss rewards wrong tokens"),
    "dropout": SHARE, "attention_dropout": SHARE, "activation_dropout": SHARE, "pooler_dropout": SHARE,
    "mask_prob": RATE, "target_mask_prob": RATE,
    "block_prob": (0.0, True, 1.0, True, "a probability"),
    "leave_unmasked_prob": (0.0, True, 1.0, True, "a probability"),
    "random_token_prob": (0.0, True, 1.0, True, "a probability"),
    "mlm_weight": (0.0, True, math.inf, False, "a loss weight"), "lm_weight": (0.0, True, math.inf, False,
                                                                              "a loss weight"),
    **{name: COUNT for name in (
        "tokens_per_sample", "max_source_tokens", "max_target_tokens", "max_source_positions", "max_target_positions",
        "max_positions", "encoder_max_positions", "decoder_max_positions", "min_block_length", "max_block_length",
        "encoder_layers", "decoder_layers", "encoder_embed_dim", "decoder_embed_dim", "encoder_ffn_embed_dim",
        "decoder_ffn_embed_dim", "encoder_attention_heads", "decoder_attention_heads", "num_segments",
        "max_tokens", "batch_size", "max_tokens_valid", "batch_size_valid", "beam", "nbest")},
    "relative_position_buckets": (0, True, math.inf, False, "a count (0: no relative position bias)"),
    "relative_position_max_distance": (0, True, math.inf, False, "a distance"),
    "max_epoch": (0, True, math.inf, False, "a count (0: no limit)"),
    "max_update": (0, True, math.inf, False, "a count (0: no limit)"),
    "num_workers": (0, True, math.inf, False, "a count of processes"),
    "clip_norm": (0.0, True, math.inf, False, "a norm (0: no clipping)"),
    "weight_decay": (0.0, True, math.inf, False, "a decay rate"),
    "warmup_updates": (0, True, math.inf, False, "a count"),
    "sampling_topp": (-1.0, True, 1.0, True, "a probability (-1: off)"),
    # fairseq-train stops at once on an --lr at or below --stop-min-lr (-1) and exits 0 with nothing learned
    "lr": (0.0, False, math.inf, False, "a learning rate"),
    "adam_eps": (0.0, True, math.inf, False, "Adam's epsilon"),
    # 0 was read as "the model size"
    "copy_attention_dim": COUNT,
}


class OptionRangeError(CommandError):
    """An option outside its range."""


def _inside(value, low, low_in, high, high_in):
    return (value > low or (low_in and value == low)) and (value < high or (high_in and value == high))


def _interval(low, low_in, high, high_in):
    def end(x):
        return "infinity" if x == math.inf else f"{x:g}"

    return f"{'[' if low_in else '('}{end(low)}, {end(high)}{']' if high_in else ')'}"


def option_flag(name, value):
    """An option as a command line writes it: ``--min-len 5``."""
    return f"--{name.replace('_', '-')} {value}"


def problem(args, named=option_flag):
    """What is out of range in ``args`` (the first option found; lists such as ``--update-freq`` entry by entry),
    or None. ``named(name, value)`` writes an option as the user gave it (``--beam 0``, or ``beam=0`` in Python)."""
    for name, (low, low_in, high, high_in, meaning) in RANGES.items():
        value = getattr(args, name, None)
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, (int, float)) and not isinstance(item, bool) and not _inside(item, low, low_in, high,
                                                                                               high_in):
                return (f"{named(name, item)}: outside {_interval(low, low_in, high, high_in)} ({meaning}); give a "
                        f"value in that range")
    for item in getattr(args, "update_freq", None) or []:
        if isinstance(item, int) and item < 1:
            return (f"{named('update_freq', item)}: outside [1, infinity) (batches per update); give a value in that "
                    "range")
    low, high = getattr(args, "min_block_length", None), getattr(args, "max_block_length", None)
    if isinstance(low, int) and isinstance(high, int) and low > high:
        return f"{named('min_block_length', low)} is above {named('max_block_length', high)}; give min <= max"
    beam, nbest = getattr(args, "beam", None), getattr(args, "nbest", None)
    if isinstance(beam, int) and isinstance(nbest, int) and nbest > beam:
        return (f"{named('nbest', nbest)} is above {named('beam', beam)}: beam search keeps only {beam} hypotheses; "
                f"give nbest <= beam")
    kept, random = getattr(args, "leave_unmasked_prob", None), getattr(args, "random_token_prob", None)
    if isinstance(kept, float) and isinstance(random, float) and kept + random > 1:
        return (f"{named('leave_unmasked_prob', kept)} and {named('random_token_prob', random)} sum to "
                f"{kept + random:g}: they are shares of the masked tokens (the rest becomes <mask>); give a sum <= 1")
    betas = _betas_problem(getattr(args, "adam_betas", None))
    if betas:
        return f"{named('adam_betas', repr(args.adam_betas))}: {betas}; give two numbers in [0, 1), e.g. '(0.9, 0.98)'"
    if getattr(args, "no_copy", False) and getattr(args, "copy_attention_dim", None) is not None:
        return (f"{named('copy_attention_dim', args.copy_attention_dim)} sizes the copy layer, which --no-copy "
                "removes: leave out one")
    return None


def _betas_problem(betas):
    """What is wrong with an ``--adam-betas`` (fairseq's ``adam`` and ``torch_adamw`` read it as a Python tuple),
    or None."""
    if betas is None:
        return None
    try:
        values = ast.literal_eval(betas) if isinstance(betas, str) else betas
    except (ValueError, SyntaxError):
        return "not a Python pair"
    if not (isinstance(values, (list, tuple)) and len(values) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)):
        return "not a pair of numbers"
    if not all(0 <= v < 1 for v in values):
        return "outside [0, 1) (the decay of Adam's moving averages)"
    return None


def training_problem(args):
    """What in a fairseq-train command line cannot train as asked (options that contradict each other or the
    machine), or None."""
    from palm_plugin.fixes.saved_model_build import training_will_load_checkpoint

    for part in ("encoder", "decoder"):
        # (a --restore-file that is not there is checkpoint_paths' to name)
        if getattr(args, f"reinit_{part}", False) and args.restore_file == "checkpoint_last.pt" and \
                not training_will_load_checkpoint(args):
            return (f"--reinit-{part} re-initialises the {part} of the pre-trained PALM that --finetune-from-model "
                    f"loads, and this run loads no checkpoint (its model starts random anyway): add "
                    f"--finetune-from-model PALM.pt, or leave out --reinit-{part}")
    if getattr(args, "fp16", False) and not (args.bf16 or args.memory_efficient_fp16 or args.fp16_no_flatten_grads):
        import torch

        if args.cpu or not torch.cuda.is_available():
            return ("--fp16: fairseq's FP16Optimizer keeps its fp32 copy of the weights on a CUDA device, and this run "
                    f"has none ({'--cpu' if args.cpu else 'no CUDA device'}): train without --fp16 on the CPU (or "
                    "with --bf16)")
    return None


def check(args):
    """Stop the command on the first option of ``args`` outside its range."""
    message = problem(args) or (training_problem(args) if hasattr(args, "update_freq") else None)
    if message:
        raise OptionRangeError(message)


def install():
    """Check every parsed command line (:func:`~palm_plugin.fixes.parsed_arguments.check_after_parsing`)."""
    check_after_parsing("__palm_option_ranges__", lambda args, argv: check(args))
