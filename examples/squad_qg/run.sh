#!/usr/bin/env bash
# SQuAD 1.1 answer-aware question generation: Du and Cardie's split (SPLIT=du) or the reversed dev/test split of
# Zhao et al. (SPLIT=reversed); UniLM section 3.3.
#   MODEL=palm|unilm|unilm2 [SPLIT=du|reversed] [SMOKE=1] [STAGES="..."] bash examples/squad_qg/run.sh
BENCHMARK=squad_qg
METRICS="bleu meteor rougel"
# Du et al.'s scripts score lower-cased, tokenised text: sacrebleu's 13a tokenisation and lower-casing stand in for
# their tokeniser; ROUGE-L is coco-caption's (beta 1.2); METEOR 1.5 as in coco-caption
BLEU_ARGS="--tokenize 13a --lowercase"
ROUGEL_ARGS="--lowercase"
SPLIT="${SPLIT:-du}"
source "$(dirname "$0")/../common.sh"
WORK="$WORK-$SPLIT"

# UniLM section 3.3 (10 epochs, batch 32, mask 0.7, lr 2e-5, label smoothing 0.1, input 464); UniLMv2 Table 10
# (lr 2e-5, batch 48, 16 epochs, warmup 10%, input 464, output 48, beam 8, length penalty 1.3). PALM section 3.5
# gives no QG settings: its generative QA ones (section 3.3: 10 epochs, batch 64, lr 1e-5, input 512, beam 5).
LABEL_SMOOTHING=0.1; WEIGHT_DECAY=0.01; MIN_LEN=1; NO_REPEAT_NGRAM=0
case "$MODEL" in
  palm)   ARCH=${ARCH:-palm_base};   LR=1e-5; TOTAL_BATCH=64; EPOCHS=10; WARMUP_RATIO=0.02
          MAX_SOURCE=512; MAX_TARGET=48; BEAM=5; LENPEN=1.0; MAX_LEN_B=48 ;;
  unilm)  ARCH=${ARCH:-unilm_large}; LR=2e-5; TOTAL_BATCH=32; EPOCHS=10; WARMUP_RATIO=0.1; MASK_PROB=0.7
          MAX_SOURCE=464; MAX_TARGET=48; BEAM=5; LENPEN=0; MAX_LEN_B=48 ;;
  unilm2) ARCH=${ARCH:-unilm2_base}; LR=2e-5; TOTAL_BATCH=48; EPOCHS=16; WARMUP_RATIO=0.1
          MAX_SOURCE=464; MAX_TARGET=48; BEAM=8; LENPEN=1.3; LENPEN_STYLE=gnmt; MAX_LEN_B=48 ;;
esac
# Decoding of unilm/unilm2: UniLM v1's decode_seq2seq.py (unilm-v1 README, SQuAD QG) sums log-probabilities
# (--length_penalty 0: LENPEN=0; its README decodes with beam 1, we keep the paper's beam 5); UniLMv2's length
# penalty 1.3 (Table 10) is s2s-ft's GNMT penalty ((5 + len) / 6) ** 1.3 (LENPEN_STYLE=gnmt). No n-gram blocking.

# Du et al.'s article lists (doclist-train.txt, doclist-test.txt from https://github.com/xinyadu/nqg, data/raw)
# must be put in $DOWNLOAD by hand.
download() {
  fetch https://rajpurkar.github.io/SQuAD-explorer/dataset/train-v1.1.json "$DOWNLOAD/train-v1.1.json"
  fetch https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v1.1.json "$DOWNLOAD/dev-v1.1.json"
  need_file "$DOWNLOAD/doclist-train.txt" "Du et al.'s article list (https://github.com/xinyadu/nqg, data/raw)"
  need_file "$DOWNLOAD/doclist-test.txt" "Du et al.'s article list (https://github.com/xinyadu/nqg, data/raw)"
}

# Du and Cardie: train and test are articles of the SQuAD training set, the SQuAD dev set is the dev set.
# Reversed (Zhao et al.): the SQuAD dev set is the test set and Du's test articles are the dev set.
convert() {
  local qg=("$BIN/palm-prepare" squad-qg --context paragraph)
  "${qg[@]}" --squad-json "$DOWNLOAD/train-v1.1.json" --doclist "$DOWNLOAD/doclist-train.txt" --out "$WORK/raw/train"
  local held_out=(--squad-json "$DOWNLOAD/train-v1.1.json" --doclist "$DOWNLOAD/doclist-test.txt")
  local dev=(--squad-json "$DOWNLOAD/dev-v1.1.json")
  case "$SPLIT" in
    du)       "${qg[@]}" "${dev[@]}" --out "$WORK/raw/valid"; "${qg[@]}" "${held_out[@]}" --out "$WORK/raw/test" ;;
    reversed) "${qg[@]}" "${held_out[@]}" --out "$WORK/raw/valid"; "${qg[@]}" "${dev[@]}" --out "$WORK/raw/test" ;;
    *) die "SPLIT must be du or reversed" ;;
  esac
}

main "$@"
