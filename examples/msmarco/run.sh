#!/usr/bin/env bash
# MS MARCO v2.1 answer generation (PALM section 3.3): passages then question -> answer. TASK=qa (Q&A task, first
# answer) or TASK=nlg (well-formed answers). The public test set has no answers: we train on train and report
# ROUGE-L on the dev set (which is also the validation set).
# Passages: the dev inputs hold all the passages retrieved for the question, as the leaderboard's test inputs do;
# the passages the annotators marked is_selected are oracle information, used on dev only when asked for by name
# (DEV_PASSAGES=selected, written to a separate "-oracle" folder). Training uses the selected ones (OURS: the
# annotations are training supervision; TRAIN_PASSAGES=all trains on what dev sees).
#   MODEL=palm|unilm|unilm2 [TASK=qa|nlg] [TRAIN_PASSAGES=selected|all] [DEV_PASSAGES=all|selected] [SMOKE=1]
#   [STAGES="..."] bash examples/msmarco/run.sh
BENCHMARK=msmarco
METRICS="rougel bleu"
ROUGEL_ARGS="--lowercase"  # MS MARCO's evaluation lower-cases; ROUGE-L with beta 1.2 (coco-caption)
BLEU_ARGS="--lowercase"
TASK="${TASK:-nlg}"  # PALM Table 2 reports the NLG task
TRAIN_PASSAGES="${TRAIN_PASSAGES:-selected}"
DEV_PASSAGES="${DEV_PASSAGES:-all}"
source "$(dirname "$0")/../common.sh"
WORK="$WORK-$TASK$([[ "$DEV_PASSAGES" == selected ]] && echo -oracle)"

# Settings: palm PAPER (PALM section 3.3): 10 epochs, batch 64, lr 1e-5, input 512, beam 5; OURS: warm-up 2%, label
# smoothing 0.1, weight decay 0.01, target 128, no n-gram blocking. UniLM / UniLMv2 did not report MS MARCO: OURS,
# taken from UniLM's generative QA (CoQA, section 3.2: 10 epochs, batch 32, mask 0.5, lr 3e-5, beam 3).
LABEL_SMOOTHING=0.1; WEIGHT_DECAY=0.01; MIN_LEN=1; NO_REPEAT_NGRAM=0
case "$MODEL" in
  palm)   ARCH=${ARCH:-palm_base};   LR=1e-5; TOTAL_BATCH=64; EPOCHS=10; WARMUP_RATIO=0.02
          MAX_SOURCE=512; MAX_TARGET=128; BEAM=5; LENPEN=1.0; MAX_LEN_B=128 ;;
  unilm)  ARCH=${ARCH:-unilm_large}; LR=3e-5; TOTAL_BATCH=32; EPOCHS=10; WARMUP_RATIO=0.1; MASK_PROB=0.5
          MAX_SOURCE=470; MAX_TARGET=128; BEAM=3; LENPEN=1.0; MAX_LEN_B=128 ;;
  unilm2) ARCH=${ARCH:-unilm2_base}; LR=3e-5; TOTAL_BATCH=32; EPOCHS=10; WARMUP_RATIO=0.1
          MAX_SOURCE=470; MAX_TARGET=128; BEAM=3; LENPEN=1.0; MAX_LEN_B=128 ;;
esac

download() {
  local split
  for split in train dev; do
    # the Q&A v2.1 files (if they moved: https://microsoft.github.io/msmarco/)
    fetch "https://msmarco.blob.core.windows.net/msmarco/${split}_v2.1.json.gz" "$DOWNLOAD/${split}_v2.1.json.gz"
    [[ -f "$DOWNLOAD/${split}_v2.1.json" ]] || gunzip -k "$DOWNLOAD/${split}_v2.1.json.gz"
  done
}

convert() {
  local marco=("$BIN/palm-prepare" msmarco --task "$TASK")
  [[ "$DEV_PASSAGES" == selected ]] && log "DEV_PASSAGES=selected: dev inputs use the annotators' passage choice" \
    "(oracle information; not comparable with leaderboard scores)"
  "${marco[@]}" --passages "$TRAIN_PASSAGES" --json "$DOWNLOAD/train_v2.1.json" --out "$WORK/raw/train"
  "${marco[@]}" --passages "$DEV_PASSAGES" --json "$DOWNLOAD/dev_v2.1.json" --out "$WORK/raw/valid"
  cp "$WORK/raw/valid.src" "$WORK/raw/test.src"
  cp "$WORK/raw/valid.tgt" "$WORK/raw/test.tgt"
}

main "$@"
