"""``--no-repeat-ngram-size`` that works on CPU.

fairseq's ``SequenceGenerator`` hands its whole token buffer ``(bsz * beam, max_len + 2)`` to ``NGramRepeatBlock``,
whose CPU path takes the last ``n - 1`` entries of that buffer (padding, beyond the current step) as the n-gram
prefix to check, so nothing is ever blocked (fairseq issue #5206). This subclass passes only the generated
prefix ``tokens[:, : step + 1]``; the CUDA extension, which reads the buffer up to ``step`` itself, is unchanged.
Importing the plugin installs it in fairseq's ``sequence_generator``, so every task's generator uses it,
fairseq's own translation task (PALM decoding) included.
"""
from fairseq.ngram_repeat_block import NGramRepeatBlock


class PrefixNGramRepeatBlock(NGramRepeatBlock):
    def forward(self, tokens, lprobs, bsz: int, beam_size: int, step: int):
        """``tokens`` ``(bsz * beam, L)`` the generator's buffer; ``lprobs`` ``(bsz * beam, V)``, updated in place."""
        if not self.use_extension:
            tokens = tokens[:, : step + 1]
        return super().forward(tokens, lprobs, bsz, beam_size, step)



def install():
    """Make fairseq's ``SequenceGenerator`` build :class:`PrefixNGramRepeatBlock` (idempotent)."""
    from fairseq import sequence_generator

    if getattr(sequence_generator.NGramRepeatBlock, "__palm_plugin__", False):
        return
    PrefixNGramRepeatBlock.__palm_plugin__ = True
    sequence_generator.NGramRepeatBlock = PrefixNGramRepeatBlock
