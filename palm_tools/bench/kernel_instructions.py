"""The plugin's Triton kernels measured without a GPU: compiled for the H100 (sm_90) as a launch compiles them, their
loops disassembled, and the machine instructions a thread issues per score of the attention (over the tiles a real
batch visits) or per element of PALM's copy layer counted. These kernels are bound by the instructions they issue,
not by their products (docs/benchmarks-gpu.md, section 13), so the counts rank changes and tilings before a card
times them.

    python -m palm_tools.bench.kernel_instructions              # each kernel's loops, per score or element
    python -m palm_tools.bench.kernel_instructions --tilings    # candidate tilings over a pmlm and a UniLM batch

Triton's compiler, ptxas and nvdisasm (as the triton wheel ships them) are all it needs. The tests of the kernels'
machine code (tests/test_attention_triton.py, tests/test_copy_triton.py) compile through the functions here.
"""
import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

# The pointer arguments that do not hold the model's dtype (bf16 here).
POINTER_TYPES = {"LSE": "fp32", "DELTA": "fp32", "BUCKET_SUMS": "fp32", "RANKS": "i32", "COUNTS": "i32",
                 "TILES": "i32", "POS": "i32", "BUCKETS": "i32"}
# The integer arguments a base-size call passes as multiples of 16, by prefix: every stride (multiples of the head
# size) and the head size; not the heads (12), the lengths (any), the table's width (2P - 1) or the seed. Every tensor
# is at 16 bytes too (torch allocates at 256; the heads' views start at multiples of 64 elements).
ALIGNED = ("stride", "head_dim")
KERNELS = ("_forward_kernel", "_query_gradient_kernel", "_key_gradient_kernel")
BUCKETS, MAX_DISTANCE, POSITIONS = 32, 128, 1024  # UniLMv2 base's relative positions


def aligned_as_launched(kernel, signature: Dict[str, str], integers: Sequence[str]) -> Dict:
    """``ASTSource``'s attributes for a launch whose tensors, and the integers named with a prefix in ``integers``,
    are multiples of 16, as Triton's launcher tells its compiler (``BaseBackend.get_*_specialization``): compiled
    without them, the kernels load one element at a time, which no launch on a card does."""
    return {(index,): [["tt.divisibility", 16]] for index, arg in enumerate(kernel.arg_names)
            if signature[arg].startswith("*") or signature[arg] == "i32" and arg.startswith(tuple(integers))}


def module_tiles(has_bias: bool = True) -> Dict:
    """Each attention kernel's tiles as the module sets them (dQ's depend on whether the bias is there)."""
    from palm_plugin.modules import attention_triton as kernels

    return {"_forward_kernel": kernels.FORWARD,
            "_query_gradient_kernel": kernels.QUERY_GRADIENT if has_bias else kernels.QUERY_GRADIENT_WITHOUT_BIAS,
            "_key_gradient_kernel": kernels.KEY_GRADIENT}


def compile_attention(name: str, tiles=None, **constants):
    """Kernel ``name`` of palm_plugin.modules.attention_triton compiled for sm_90 as a base-size bf16 launch compiles
    it (heads of 64), with ``tiles`` (the module's unless given) and ``constants`` (HAS_BIAS, DROPOUT; NUM_BUCKETS 32
    unless given)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from palm_plugin.modules import attention_triton as kernels

    kernel = getattr(kernels, name)
    tiles = tiles or module_tiles(constants["HAS_BIAS"])[name]
    if "NUM_BUCKETS" in kernel.arg_names:
        constants.setdefault("NUM_BUCKETS", BUCKETS)
    constants = dict(DIM=64, BLOCK_M=tiles.rows, BLOCK_N=tiles.keys, PRECISION="tf32", **constants)
    signature = {arg: "constexpr" if arg in constants else f"*{POINTER_TYPES.get(arg, 'bf16')}"
                 if arg.isupper() else "fp32" if arg.startswith("scale") or arg == "rate" else "i32"
                 for arg in kernel.arg_names}
    return triton.compile(ASTSource(kernel, signature, constants, aligned_as_launched(kernel, signature, ALIGNED)),
                          target=GPUTarget("cuda", 90, 32), options=dict(num_warps=tiles.warps))


def sass_loops(compiled, directory) -> List[List[str]]:
    """The machine instructions of each outermost loop of a compiled kernel (from a label to the branch back to
    it), disassembled by the nvdisasm Triton ships; ``directory`` takes the binary."""
    import triton

    cubin = Path(directory) / "kernel.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    text = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    labels, instructions = {}, []
    for line in text.splitlines():
        label = re.match(r"^\.(L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(instructions)
        elif re.match(r"\s+/\*[0-9a-f]{4,}\*/", line):
            instructions.append(line.split("*/", 1)[1].strip())
    loops = [(labels[m.group(1)], at) for at, line in enumerate(instructions)
             for m in [re.search(r"BRA\s+`\(\.(L_x_\d+)\)", line)] if m and labels.get(m.group(1), at + 1) <= at]
    outer = [(begin, end) for begin, end in loops
             if not any(b <= begin and end <= e and (b, e) != (begin, end) for b, e in loops)]
    return [instructions[begin:end + 1] for begin, end in outer if end > begin]  # not the branch-to-itself at the end


# PALM's copy kernels (palm_plugin.modules.copy_attention_triton): the pointers' dtypes in order, and which tile
# sizes each takes (palm_base: an attention size of 768, bf16)
COPY_KERNELS = {"_scores_kernel": (("bf16", "bf16", "bf16", "fp32"), ("BLOCK_T", "BLOCK_S")),
                "_query_gradient_kernel": (("bf16", "bf16", "bf16", "fp32", "bf16", "fp32"), ("BLOCK_T", "BLOCK_A")),
                "_memory_gradient_kernel": (("bf16", "bf16", "bf16", "fp32", "bf16"), ("BLOCK_S", "BLOCK_A"))}


def compile_copy(name: str):
    """Copy kernel ``name`` compiled for sm_90 as a palm_base launch compiles it (its tensors and padded lengths at
    multiples of 16, the lengths themselves any), with the module's tiles; and the elements of its tile a thread
    computes at each step of its loop."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from palm_plugin.modules import copy_attention_triton as kernels

    kernel, (pointers, tile) = getattr(kernels, name), COPY_KERNELS[name]
    sizes = dict(zip(("BLOCK_T", "BLOCK_S", "BLOCK_A"), kernels.TILE))
    constants = {**{key: sizes[key] for key in tile}, "DIM": 768}
    signature = {arg: "constexpr" if arg in constants else "i32" for arg in kernel.arg_names}
    signature.update(zip(kernel.arg_names, [f"*{dtype}" for dtype in pointers]))
    compiled = triton.compile(ASTSource(kernel, signature, constants, aligned_as_launched(kernel, signature,
                                                                                          ("padded",))),
                              target=GPUTarget("cuda", 90, 32))
    rows, columns = (constants[key] for key in tile)
    return compiled, rows * columns // (32 * compiled.metadata.num_warps)


class Costs(NamedTuple):
    """Instructions a thread issues per score in the loop over whole tiles and in that over partly shown ones."""

    whole: float
    partial: float


def loop_costs(name: str, tiles, directory, **constants) -> Costs:
    """The two loops' instructions per score of kernel ``name`` on ``tiles``."""
    return costs_of(sass_loops(compile_attention(name, tiles, **constants), directory), tiles)


def costs_of(loops, tiles) -> Costs:
    """The instructions per score of an attention kernel's two loops as :func:`sass_loops` gives them (whole tiles',
    then partly shown tiles'), each thread computing its share of a ``tiles`` tile."""
    whole, partial = loops
    scores = tiles.rows * tiles.keys / (32 * tiles.warps)
    return Costs(len(whole) / scores, len(partial) / scores)


class Batch(NamedTuple):
    """A batch's attention mask ``(B, T, T)`` and, for UniLMv2, its position ids ``(B, T)``."""

    mask: torch.Tensor
    positions: Optional[torch.Tensor]


def pmlm_layout(text_lengths: Sequence[int], length: int, append_pseudo: bool = True,
                predict_masked_slots: bool = True, seed: int = 0):
    """A pseudo-masked LM batch as the pmlm dataset lays it out (Figure 5 of UniLMv2): texts of ``text_lengths``
    random tokens, Algorithm 1's blockwise masking, then [P] and original tokens appended per factorization step;
    padded to ``length``. Returns the mask fields and the position ids."""
    from palm_plugin.data.blockwise_masking import BlockwiseMaskingPolicy
    from palm_plugin.data.collate import pad_rows
    from palm_plugin.data.pmlm_dataset import pseudo_masked_example

    pad, pseudo, mask = 1, 5, 4
    rng = np.random.default_rng(seed)
    policy = BlockwiseMaskingPolicy()
    rows = []
    for text_length in text_lengths:
        tokens = rng.integers(10, 40, text_length)
        maskable = np.ones(text_length, dtype=bool)
        maskable[[0, -1]] = False  # [SOS], [EOS]
        steps = policy.factorization_steps(maskable, rng)
        noised = np.where(steps >= 0, mask, tokens)
        rows.append(pseudo_masked_example(tokens, steps, noised, pseudo, append_pseudo, predict_masked_slots))
    if max(len(row["source"]) for row in rows) > length:
        raise ValueError(f"the texts with their appended tokens take {max(len(r['source']) for r in rows)} tokens, "
                         f"more than the length {length}")

    def merge(key, value):
        merged = pad_rows([torch.from_numpy(row[key]) for row in rows], value)
        return torch.nn.functional.pad(merged, (0, length - merged.size(1)), value=value)

    padding = merge("source", pad).eq(pad)
    return dict(padding_mask=padding, steps=merge("steps", 0), kinds=merge("kinds", 0)), merge("positions", 0)


def batch_mask(fields) -> torch.Tensor:
    from palm_plugin.modules.attention_masks import as_pmlm_layout, pmlm_mask
    from palm_plugin.modules.flex_attention import MaskFields

    mask_fields = MaskFields(**fields)
    steps, kinds = as_pmlm_layout(mask_fields.padding_mask, **mask_fields.fields)
    return pmlm_mask(steps, kinds, mask_fields.padding_mask)


def pmlm_batch() -> Batch:
    """8 texts of 512 tokens in pmlm AE+PAR's layout (674 tokens at most with the appended ones)."""
    fields, positions = pmlm_layout((512,) * 8, 704)
    return Batch(batch_mask(fields), positions)


def unilm_batch() -> Batch:
    """UniLM's pre-training mix, 12 rows of up to 512 tokens: a third bidirectional, a third seq2seq (sources of
    about half), a sixth each left-to-right and right-to-left, as the paper mixes them."""
    from palm_plugin.modules.attention_masks import Objective

    lengths = torch.tensor([512, 480, 500, 512, 512, 490, 512, 470, 512, 505, 512, 460])
    objectives = [Objective.BIDIRECTIONAL] * 4 + [Objective.SEQ2SEQ] * 4 + [Objective.LEFT_TO_RIGHT] * 2 + \
        [Objective.RIGHT_TO_LEFT] * 2
    fields = dict(padding_mask=torch.arange(512)[None, :] >= lengths[:, None],
                  objectives=torch.tensor([int(o) for o in objectives]),
                  source_lengths=torch.tensor([0] * 4 + [256, 240, 250, 230] + [0] * 4))
    return Batch(batch_mask(fields), None)


def batch_instructions(name: str, tiles, batch: Batch, directory, **constants) -> float:
    """Millions of thread instructions kernel ``name`` on ``tiles`` issues for one head of ``batch``: each visited
    tile at its loop's cost; dQ with the bias at the buckets each tile reaches (every bucket's sums are unrolled in
    the code, and a tile runs only those it reaches)."""
    from palm_plugin.modules.attention_triton import tile_lists
    from palm_plugin.modules.relative_position import RelativePositionBias

    keys_held = name == "_key_gradient_kernel"
    mask = batch.mask.transpose(1, 2) if keys_held else batch.mask
    held, walked = (tiles.keys, tiles.rows) if keys_held else (tiles.rows, tiles.keys)
    counts, order = tile_lists(mask, held, walked)
    costs = loop_costs(name, tiles, directory, **constants)
    if not (name == "_query_gradient_kernel" and constants.get("HAS_BIAS")):
        total = counts[..., 1].sum().item() * costs.whole + counts[..., 0].sum().item() * costs.partial
        return total * tiles.rows * tiles.keys / 1e6
    half = loop_costs(name, tiles, directory, **dict(constants, NUM_BUCKETS=BUCKETS // 2))
    per_bucket = Costs(*((full - fewer) / (BUCKETS // 2) for full, fewer in zip(costs, half)))
    buckets = RelativePositionBias(1, BUCKETS, MAX_DISTANCE).offset_buckets(POSITIONS)
    total = 0.0
    for b in range(mask.size(0)):
        for row in range(counts.size(1)):
            partial, whole = counts[b, row].tolist()
            queries = batch.positions[b, row * held:(row + 1) * held]
            for at, tile in enumerate(order[b, row, :partial + whole].tolist()):
                keys = batch.positions[b, tile * walked:(tile + 1) * walked]
                reached = len(torch.unique(buckets[keys[None, :] - queries[:, None] + POSITIONS - 1]))
                kind = 1 if at < partial else 0
                total += costs[kind] - (BUCKETS - reached) * per_bucket[kind]
    return total * tiles.rows * tiles.keys / 1e6


# The tilings compared (rows x keys, warps); the module's must be among them.
CANDIDATES = {
    "_forward_kernel": [(64, 64, 4), (128, 64, 8), (64, 32, 4), (128, 128, 8), (128, 32, 8)],
    "_query_gradient_kernel": [(64, 64, 4), (128, 64, 8), (64, 32, 4), (128, 32, 8), (64, 16, 4)],
    "_key_gradient_kernel": [(32, 64, 4), (32, 128, 8), (64, 64, 4), (16, 64, 4)],
}


def tilings(directory) -> List[Tuple[str, str, Tuple[int, int, int], float]]:
    """(kernel, batch, tiling, millions of instructions) for every candidate on the pmlm batch (bias and dropout)
    and the UniLM batch (dropout), as the recipes train."""
    from palm_plugin.modules.attention_triton import Tiles

    rows = []
    for case, batch, has_bias in (("pmlm AE+PAR", pmlm_batch(), True), ("UniLM mix", unilm_batch(), False)):
        for name, candidates in CANDIDATES.items():
            for tiling in candidates:
                total = batch_instructions(name, Tiles(*tiling), batch, directory, HAS_BIAS=has_bias, DROPOUT=True)
                rows.append((name, case, tiling, total))
    return rows


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m palm_tools.bench.kernel_instructions",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tilings", action="store_true",
                        help="compare candidate tilings over a pmlm AE+PAR and a UniLM pre-training batch (a few "
                             "minutes: each tiling compiles, and dQ's bucket reach is counted tile by tile)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        if args.tilings:
            print("| kernel | batch | tiles (rows x keys, warps) | millions of thread instructions, one head |")
            print("|---|---|---|---:|")
            for name, case, tiling, total in tilings(directory):
                chosen = tuple(module_tiles(case.startswith("pmlm"))[name]) == tiling
                print(f"| {name} | {case} | {tiling[0]} x {tiling[1]}, {tiling[2]}{' (module)' if chosen else ''} "
                      f"| {total:.0f} |")
            return
        print("Attention (instructions a thread issues per score):\n")
        print("| kernel | bias | dropout | whole tiles | partly shown tiles |")
        print("|---|---|---|---:|---:|")
        for name in KERNELS:
            for has_bias in (False, True):
                for dropout in (False, True):
                    costs = loop_costs(name, module_tiles(has_bias)[name], directory, HAS_BIAS=has_bias,
                                       DROPOUT=dropout)
                    print(f"| {name} | {has_bias} | {dropout} | {costs.whole:.1f} | {costs.partial:.1f} |")
        print("\nPALM's copy layer (instructions a thread issues per element of its loop; barriers a step):\n")
        print("| kernel | instructions | barriers |")
        print("|---|---:|---:|")
        for name in COPY_KERNELS:
            compiled, elements = compile_copy(name)
            loop, = sass_loops(compiled, directory)
            barriers = sum("BAR.SYNC" in line for line in loop)
            print(f"| {name} | {len(loop) / elements:.2f} | {barriers} |")


if __name__ == "__main__":
    main()
