"""Every change the plugin makes to fairseq's behaviour, one module each, installed in this order on import.

Each module fixes one fairseq behaviour, names the fairseq issue (or the torch change) behind it, and has one
``install()`` that patches fairseq in place and marks what it installed with ``__palm_plugin__``, so a second
import (fairseq imports a ``--user-dir`` more than once in some commands) changes nothing. A new fix goes in a new
module here and gets one row in :data:`FIXES`; nothing else in the plugin patches fairseq.

Order matters in one place only: :mod:`.bf16_without_xla` wraps the architecture functions that are registered when the
plugin's models are imported, so :func:`install_after_registration` runs it after them.
"""
from palm_plugin.fixes import (
    batch_remainder,
    bf16_without_xla,
    bpe_files,
    checkpoint_copy,
    checkpoint_paths,
    compiled_decoder_layers,
    cudnn_attention,
    data_checks,
    distributed,
    diverse_beam_rows,
    ema_integer_state,
    generation_options,
    hydra_config,
    input_errors,
    loader_exit,
    model_overrides,
    multi_tensor_optimizer,
    ngram_repeat_block,
    numpy_compat,
    option_help,
    option_ranges,
    quiet_warnings,
    safe_loading,
    save_dir_guard,
    saved_model_build,
)

# (module, what it fixes) — the module docstrings give the details and the fairseq issue.
FIXES = (
    (safe_loading, "torch >= 2.6 weights-only loading refuses fairseq checkpoints; allow-list their types"),
    (checkpoint_copy, "checkpoint_last.pt / checkpoint_best.pt copied non-atomically: a killed run truncates them"),
    (data_checks, "an empty, cut-short or all-too-long split fails inside numpy or batch_by_size"),
    (numpy_compat, "fairseq 0.12 reads np.compat.long and np.percentile(interpolation=), which numpy 2 lacks: "
                   "--sample-break-mode eos and --num-batch-buckets fail at loading the data"),
    (ema_integer_state, "--store-ema stops at its first step on a model with an integer buffer"),
    (batch_remainder, "--required-batch-size-multiple drops the last batch (fairseq #5036)"),
    (option_help, "--help lists no task, model or criterion options"),
    (ngram_repeat_block, "--no-repeat-ngram-size blocks nothing on CPU (fairseq #5206)"),
    (generation_options, "no GNMT length penalty (--lenpen-style gnmt) or n-gram blocking that ignores tokens"),
    (quiet_warnings, "hydra deprecation and CPU pin_memory warnings on every command"),
    (distributed, "torchrun without GPUs: division by zero, and every process training alone; more processes than "
                  "GPUs without torchrun: an assertion, a crash, or no process and exit status 0"),
    (saved_model_build, "models cannot tell a build for a saved checkpoint from a new one (--roberta-path re-read)"),
    (option_ranges, "numeric options out of range (--label-smoothing 1.5, --mask-prob 0, --beam 0) train or fail "
                    "deep inside"),
    (checkpoint_paths, "a directory, missing or HF file as a checkpoint trains from scratch or fails obscurely; "
                       "fine-tuning needs the checkpoint's sizes retyped"),
    (save_dir_guard, "two runs into one --save-dir overwrite each other; a run of another task or model silently "
                     "resumes the checkpoint of the folder"),
    (bpe_files, "a tokenizer file of another scheme given to --bpe (a WordPiece vocab.txt as --sentencepiece-model) "
                "fails deep inside the tokenizer"),
    (cudnn_attention, "--fp16/--bf16 on Hopper GPUs: cuDNN attention builds a graph per new batch shape, and "
                      "length-bucketed batches change shape every update"),
    (compiled_decoder_layers, "--compile-layers compiles each decoder layer apart (the incremental-state id), and "
                              "none past torch's recompile limit of 8"),
    (model_overrides, "--model-overrides keys the checkpoint's configuration lacks (a typo) are dropped silently"),
    (diverse_beam_rows, "--diverse-beam-groups reads its counts by sample id as a batch row: another sentence's "
                        "counts, or an IndexError (fairseq #5069's cumulative diversity)"),
    (multi_tensor_optimizer, "Adam updates, --fp16 / --bf16's copies to and from the fp32 master weights, and "
                             "clip_grad_norm_'s norms go one parameter (one GPU kernel launch each) at a time"),
    (loader_exit, "a run stopped before its epoch's end (--max-update) can abort at exit (-6, 'terminate called "
                  "without an active exception') in fairseq's batch-loading thread"),
    (hydra_config, "fairseq-hydra-train builds an architecture's model at the base sizes (fairseq #4675), and no "
                   "check of a parsed command line sees its configuration"),
    (input_errors, "the plugin's errors of bad input inside the tasks, models and loaders end fairseq's commands "
                   "below a traceback, not as one line (a spawned process's, in its parent, too)"),
)
FIXES_AFTER_REGISTRATION = (
    (bf16_without_xla, "--bf16 implies --tpu and asks torch_xla for a device, on CPUs and GPUs alike"),
)


def install() -> None:
    """Install the fixes that do not depend on the plugin's registrations (idempotent)."""
    for module, _ in FIXES:
        module.install()


def install_after_registration() -> None:
    """Install the fixes that wrap registered architectures (idempotent; call after importing the models)."""
    for module, _ in FIXES_AFTER_REGISTRATION:
        module.install()
