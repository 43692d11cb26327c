# Hyper-parameters shared by the dialog recipes (cornell, chitchat): response generation scored by the perplexity
# of the reference responses (fairseq-generate --score-reference, then palm-score ppl). Sourced after common.sh.
#
# PALM section 3.6: "the same training hyperparameters from generative QA fine-tuning" (section 3.3: 10 epochs,
# batch 64, lr 1e-5). UniLM section 3.4 (DSTC7 response generation): 20 epochs, batch 64, mask 0.5, maximum length
# 512, beam 10, responses up to 40 tokens; it gives no learning rate for that task: its other seq2seq tasks' 3e-5.
# UniLMv2 reported no dialog task: UniLM's settings with UniLMv2's summarisation learning rate (Table 10, 7e-5).
METRICS="ppl"
SCORE_REFERENCE=1  # decode = score the reference responses
LABEL_SMOOTHING=0.1; WEIGHT_DECAY=0.01; MIN_LEN=1; LENPEN=1.0; MAX_SOURCE=128; MAX_TARGET=64
case "$MODEL" in
  palm)   ARCH=${ARCH:-palm_base};   LR=1e-5; TOTAL_BATCH=64; EPOCHS=10; WARMUP_RATIO=0.02; BEAM=5; MAX_LEN_B=40 ;;
  unilm)  ARCH=${ARCH:-unilm_large}; LR=3e-5; TOTAL_BATCH=64; EPOCHS=20; WARMUP_RATIO=0.02; MASK_PROB=0.5
          BEAM=10; MAX_LEN_B=40 ;;
  unilm2) ARCH=${ARCH:-unilm2_base}; LR=7e-5; TOTAL_BATCH=64; EPOCHS=20; WARMUP_RATIO=0.02
          BEAM=10; MAX_LEN_B=40 ;;
  *)      die "MODEL must be palm, unilm or unilm2" ;;
esac
