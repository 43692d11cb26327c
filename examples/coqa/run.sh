#!/usr/bin/env bash
# CoQA generative question answering (UniLM section 3.2): history + question + passage -> free-form answer. The
# test set is hidden: we report on the dev set (which is also the validation set).
#   MODEL=palm|unilm|unilm2 [SMOKE=1] [STAGES="..."] bash examples/coqa/run.sh
BENCHMARK=coqa
METRICS="f1"  # CoQA's official measure: word-overlap F1 of normalised answers (UniLM Table 7)
source "$(dirname "$0")/../common.sh"

# UniLM section 3.2: 10 epochs, batch 32, mask 0.5, maximum length 512 (question and passage 470), label smoothing
# 0.1, beam 3. PALM: its generative QA settings (section 3.3).
LABEL_SMOOTHING=0.1; WEIGHT_DECAY=0.01; MIN_LEN=1; NO_REPEAT_NGRAM=0
case "$MODEL" in
  palm)   ARCH=${ARCH:-palm_base};   LR=1e-5; TOTAL_BATCH=64; EPOCHS=10; WARMUP_RATIO=0.02
          MAX_SOURCE=512; MAX_TARGET=42; BEAM=5; LENPEN=1.0; MAX_LEN_B=42 ;;
  unilm)  ARCH=${ARCH:-unilm_large}; LR=3e-5; TOTAL_BATCH=32; EPOCHS=10; WARMUP_RATIO=0.1; MASK_PROB=0.5
          MAX_SOURCE=470; MAX_TARGET=42; BEAM=3; LENPEN=0; MAX_LEN_B=42 ;;
  unilm2) ARCH=${ARCH:-unilm2_base}; LR=3e-5; TOTAL_BATCH=32; EPOCHS=10; WARMUP_RATIO=0.1
          MAX_SOURCE=470; MAX_TARGET=42; BEAM=3; LENPEN=0; MAX_LEN_B=42 ;;
esac
# Decoding of unilm/unilm2: the authors' decode_seq2seq.py sums log-probabilities by default (--length_penalty 0:
# LENPEN=0); neither paper blocks n-grams for QA. Ours: MIN_LEN 1 and the answer cap MAX_LEN_B.

download() {
  fetch https://nlp.stanford.edu/data/coqa/coqa-train-v1.0.json "$DOWNLOAD/coqa-train-v1.0.json"
  fetch https://nlp.stanford.edu/data/coqa/coqa-dev-v1.0.json "$DOWNLOAD/coqa-dev-v1.0.json"
}

convert() {
  # history and question come before the passage, so cutting the source to MAX_SOURCE shortens the passage, never
  # the question; two earlier turns (MAX_HISTORY) leave most of the passage in view
  "$BIN/palm-prepare" coqa --json "$DOWNLOAD/coqa-train-v1.0.json" --max-history "${MAX_HISTORY:-2}" \
    --out "$WORK/raw/train"
  "$BIN/palm-prepare" coqa --json "$DOWNLOAD/coqa-dev-v1.0.json" --max-history "${MAX_HISTORY:-2}" \
    --out "$WORK/raw/valid"
  cp "$WORK/raw/valid.src" "$WORK/raw/test.src"
  cp "$WORK/raw/valid.tgt" "$WORK/raw/test.tgt"
}

main "$@"
