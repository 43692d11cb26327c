#!/usr/bin/env bash
# MS MARCO v2.1 answer generation (PALM section 3.3): passages then question -> answer. TASK=qa (Q&A task, first
# answer) or TASK=nlg (well-formed answers). The public test set has no answers: we train on train and report
# ROUGE-L on the dev set (which is also the validation set).
#   MODEL=palm|unilm|unilm2 [TASK=qa|nlg] [SMOKE=1] [STAGES="..."] bash examples/msmarco/run.sh
BENCHMARK=msmarco
METRICS="rougel bleu"
ROUGEL_ARGS="--lowercase"  # MS MARCO's evaluation lower-cases; ROUGE-L with beta 1.2 (coco-caption)
BLEU_ARGS="--lowercase"
TASK="${TASK:-nlg}"  # PALM Table 2 reports the NLG task
source "$(dirname "$0")/../common.sh"
WORK="$WORK-$TASK"

# PALM section 3.3: 10 epochs, batch 64, lr 1e-5, input 512, beam 5. UniLM / UniLMv2 did not report MS MARCO:
# their generative QA settings (UniLM CoQA, section 3.2: 10 epochs, batch 32, mask 0.5, lr 3e-5, beam 3).
LABEL_SMOOTHING=0.1; WEIGHT_DECAY=0.01; MIN_LEN=1; NO_REPEAT_NGRAM=0
case "$MODEL" in
  palm)   ARCH=${ARCH:-palm_base};   LR=1e-5; TOTAL_BATCH=64; EPOCHS=10; WARMUP_RATIO=0.02
          MAX_SOURCE=512; MAX_TARGET=128; BEAM=5; LENPEN=1.0; MAX_LEN_B=128 ;;
  unilm)  ARCH=${ARCH:-unilm_large}; LR=3e-5; TOTAL_BATCH=32; EPOCHS=10; WARMUP_RATIO=0.1; MASK_PROB=0.5
          MAX_SOURCE=470; MAX_TARGET=128; BEAM=3; LENPEN=0; MAX_LEN_B=128 ;;
  unilm2) ARCH=${ARCH:-unilm2_base}; LR=3e-5; TOTAL_BATCH=32; EPOCHS=10; WARMUP_RATIO=0.1
          MAX_SOURCE=470; MAX_TARGET=128; BEAM=3; LENPEN=0; MAX_LEN_B=128 ;;
esac
# Decoding of unilm/unilm2: the authors' decode_seq2seq.py sums log-probabilities by default (--length_penalty 0:
# LENPEN=0); no n-gram blocking for QA. Ours: MIN_LEN 1 and the answer cap MAX_LEN_B.

download() {
  local split
  for split in train dev; do
    # the Q&A v2.1 files (if they moved: https://microsoft.github.io/msmarco/)
    fetch "https://msmarco.blob.core.windows.net/msmarco/${split}_v2.1.json.gz" "$DOWNLOAD/${split}_v2.1.json.gz"
    [[ -f "$DOWNLOAD/${split}_v2.1.json" ]] || gunzip -k "$DOWNLOAD/${split}_v2.1.json.gz"
  done
}

convert() {
  local marco=("$BIN/palm-prepare" msmarco --task "$TASK" --passages selected)
  "${marco[@]}" --json "$DOWNLOAD/train_v2.1.json" --out "$WORK/raw/train"
  "${marco[@]}" --json "$DOWNLOAD/dev_v2.1.json" --out "$WORK/raw/valid"
  cp "$WORK/raw/valid.src" "$WORK/raw/test.src"
  cp "$WORK/raw/valid.tgt" "$WORK/raw/test.tgt"
}

main "$@"
