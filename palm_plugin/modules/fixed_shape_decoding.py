"""UniLM / UniLMv2 cached decoding with fixed shapes, replayed as one CUDA graph per step (``--decoding-graph``).

The cached decoder of :mod:`palm_plugin.models.unilm` grows its target cache by one token per step: each step has new
shapes, and its ~30 kernels per layer are launched one by one from Python. At one sentence per batch that launching,
not the arithmetic, is the time of a step on a GPU (docs/benchmarks-gpu.md). Here:

* the target cache is a buffer of slots (all layers' keys and values in one tensor), doubled when full; slots not yet
  written are hidden by the mask;
* every step feeds two rows, the token decoded last and the placeholder (at the first step the first row stands in
  for nothing: its key is hidden), and reads its step number from a tensor;

so all steps of a decode have the same shapes. On CUDA the whole step (embeddings, every layer, the LM head) is
captured once as a CUDA graph and replayed with one launch per step; on the CPU the same step runs eagerly. A step
writes the keys and values of the token decoded last into its slot and reads only earlier slots, so running it twice
changes nothing (capturing runs it before recording it). Reordering beams is one ``index_select`` of the buffer; new
rows (a sentence finished), another source cache or a doubled buffer are captured again. The values equal the
growing cache's (tests/test_unilm_decoding.py, and on CUDA tests/test_gpu.py).
"""
import torch

from palm_plugin.modules.attention_masks import to_additive

INITIAL_SLOTS = 64  # target tokens the buffer holds before it doubles


class FixedShapeStep:
    """The state of one decode: the slot buffer, the step's input tensors and (on CUDA) the captured graph."""

    def __init__(self, decoder, encoder_out, rows: int, device, dtype):
        self.decoder = decoder
        stack = decoder.stack
        layer = stack.layers[0]
        self.cache = torch.zeros(len(stack.layers), 2, rows, layer.num_heads, INITIAL_SLOTS, layer.head_dim,
                                 dtype=dtype, device=device)  # fmt: skip
        self.tokens = torch.full((rows, 2), decoder.placeholder, dtype=torch.long, device=device)
        self.step = torch.zeros((), dtype=torch.long, device=device)
        self.pair = torch.arange(2, device=device)
        self.own = torch.eye(2, dtype=torch.bool, device=device)  # each new row sees itself
        self.below = torch.tensor([[False, False], [True, False]], device=device)  # the placeholder sees the token
        self.graph = self.output = self.bound = None
        self.bind(encoder_out)

    @property
    def rows(self) -> int:
        return self.cache.size(2)

    def bind(self, encoder_out):
        """Take the per-row tensors of ``encoder_out`` (the sentence of each row, its source cache); a new binding
        needs a new graph."""
        d = self.decoder
        source_padding = d._rows(encoder_out["source_padding"][0], encoder_out)
        self.source_keys, self.source_values = encoder_out["source_keys"], encoder_out["source_values"]
        self.source_lengths = (~source_padding).sum(1, keepdim=True)
        self.source_visible = (~source_padding).unsqueeze(1).expand(-1, 2, -1)
        self.source_positions = torch.arange(source_padding.size(1), device=self.cache.device).expand(self.rows, -1)
        self.segments = d._rows(encoder_out["target_segment"][0], encoder_out).unsqueeze(1).expand(-1, 2)
        tables = encoder_out.get("relative_bias_table") or [None]
        self.bias_table = tables[0]
        self.slots = torch.arange(self.cache.size(4), device=self.cache.device)
        self.bound, self.graph = self._binding(encoder_out), None

    def _binding(self, encoder_out):
        return self.rows, self.cache.size(4), encoder_out["source_keys"][0].data_ptr(), encoder_out["rows_per_source"][0]

    def run(self):
        """One step from the tensors (no host synchronisation, no allocation from host data: capturable). Returns
        the placeholder rows' logits ``(N, 1, V)``."""
        stack, t = self.decoder.stack, self.step
        positions = self.source_lengths + t - 1 + self.pair  # (N, 2): the token decoded last, the placeholder
        slot_positions = self.source_lengths + self.slots
        key_positions = torch.cat([self.source_positions, slot_positions, positions], dim=1)
        rows, slots = self.rows, self.slots.numel()
        mask = torch.cat([self.source_visible, (self.slots < t - 1).expand(rows, 2, slots),
                          (self.own | (self.below & (t >= 1))).expand(rows, 2, 2)], dim=2)  # fmt: skip
        x = stack.embeddings(self.tokens, positions.clamp(max=stack.embeddings.positions.num_embeddings - 1),
                             self.segments, check=False)  # fmt: skip
        additive = stack.attention_bias(positions, key_positions, mask, x.dtype, self.bias_table)
        if additive.dtype == torch.bool:
            additive = to_additive(additive, x.dtype)
        slot = (t - 1).clamp(min=0).view(1)
        for index, layer in enumerate(stack.layers):
            keys, values = self.cache[index, 0], self.cache[index, 1]
            x, (k_new, v_new) = layer.forward_cached(
                x, (self.source_keys[index], self.source_values[index]), (keys, values), additive)
            keys.index_copy_(2, slot, k_new[:, :, :1])
            values.index_copy_(2, slot, v_new[:, :, :1])
        return self.decoder.lm_head(x[:, -1:])

    def __call__(self, prev_output_tokens, encoder_out):
        decoded = prev_output_tokens.size(1) - 1
        if decoded > self.cache.size(4):  # slot decoded - 1 would not exist: double the buffer
            self.cache = torch.cat([self.cache, torch.zeros_like(self.cache)], dim=4)
            self.bound = None
        if self.bound != self._binding(encoder_out):
            self.bind(encoder_out)
        self.tokens[:, 0] = prev_output_tokens[:, -1]
        self.step.fill_(decoded)
        if self.cache.device.type != "cuda":
            return self.run()
        if self.graph is None:
            self.graph, self.output = capture(self.run)
        self.graph.replay()
        return self.output

    def reorder(self, new_order):
        """Follow beam search: rows ``new_order`` of the buffer (fewer rows when sentences are finished)."""
        if new_order.numel() == self.rows:
            self.cache.copy_(self.cache.index_select(2, new_order))
        else:
            self.cache = self.cache.index_select(2, new_order)
            self.tokens = self.tokens[: new_order.numel()].clone()
            self.bound = None


def capture(run):
    """``run`` recorded as a CUDA graph (after two runs on a side stream, as torch asks); returns the graph and the
    tensor its replays write the output to."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = run()
    return graph, output
