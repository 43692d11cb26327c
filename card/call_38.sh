# Issue 38, the next card call (docs/benchmarks-gpu.md, end of section 12): about 9 minutes.
# run: carry .whl; timeout_s 600
# The CUDA tests in three processes, the relative-bias tests first and alone; then the UniLM family beside roberta
# at 64 and 256 sequences of 512 and the Triton attention's lever (the recipes' attention dropout; the plain row is
# its baseline, `no_attention_dropout` SDPA without it) on pmlm AE+PAR and both UniLM configurations, profiled.
source card/common.sh
install_wheels
cuda_tests 90 "relative_bias" "vocabulary or triton_copy or default_copy" \
    "triton_attention or fused_attention and triton"
tool 270 palm_tools.bench.cli --sweep --device cuda --only roberta pmlm_ae_par unilm_pretraining unilm_seq2seq \
    --lengths 512 --sequences 64 256 --no-find-max --no-decoding --levers triton_attention no_attention_dropout \
    --lever-configs pmlm_ae_par unilm_pretraining unilm_seq2seq --lever-sequences 64 --profile-levers triton_attention \
    --time-budget-min 3.5 --profile-dir "$OUT/prof" --output-dir "$OUT/bench"
if [ -z "${CARD_PLAN:-}" ] && [ -d "$OUT/prof" ]; then tar czf "$OUT/prof.tgz" -C "$OUT" prof; fi
