#!/usr/bin/env bash
# XSum extreme summarisation (Narayan et al. 2018). See examples/README.md.
#   MODEL=palm|unilm|unilm2 [SMOKE=1] [STAGES="..."] bash examples/xsum/run.sh
BENCHMARK=xsum
METRICS="rouge"
source "$(dirname "$0")/../common.sh"

# UniLMv2 appendix Table 10 (lr 7e-5, batch 64, 14 epochs, warmup 2%, input 720, output 48, beam 5, length
# penalty 0.6); PALM and UniLM v1 did not report XSum: their CNN/DM settings with XSum's lengths.
LABEL_SMOOTHING=0.1; WEIGHT_DECAY=0.01; MIN_LEN=1; NO_REPEAT_NGRAM=3
case "$MODEL" in
  palm)   ARCH=${ARCH:-palm_base};   LR=1e-5; TOTAL_BATCH=64; EPOCHS=10; WARMUP_RATIO=0.02
          MAX_SOURCE=512; MAX_TARGET=48; BEAM=5; LENPEN=1.0; MAX_LEN_B=48 ;;
  unilm)  ARCH=${ARCH:-unilm_large}; LR=3e-5; TOTAL_BATCH=32; EPOCHS=30; WARMUP_RATIO=0.02; MASK_PROB=0.7
          MAX_SOURCE=720; MAX_TARGET=48; BEAM=5; LENPEN=1.0; MAX_LEN_B=48 ;;
  unilm2) ARCH=${ARCH:-unilm2_base}; LR=7e-5; TOTAL_BATCH=64; EPOCHS=14; WARMUP_RATIO=0.02
          MAX_SOURCE=720; MAX_TARGET=48; BEAM=5; LENPEN=0.6; MAX_LEN_B=48 ;;
esac
# UniLM v1 (CNN/DM) and UniLMv2 (CNN/DM, XSum) fine-tune at 768 positions; the released models have 512, grown as
# the authors' s2s-ft does (the pre-trained rows copied again)
[[ "$MODEL" == unilm || "$MODEL" == unilm2 ]] && POSITIONS=${POSITIONS:-768}

download() {
  fetch https://raw.githubusercontent.com/EdinburghNLP/XSum/master/XSum-Dataset/XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json \
    "$DOWNLOAD/XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json"
  fetch http://bollin.inf.ed.ac.uk/public/direct/XSUM-EMNLP18-Summary-Data-Original.tar.gz \
    "$DOWNLOAD/XSUM-EMNLP18-Summary-Data-Original.tar.gz"
  [[ -d "$DOWNLOAD/bbc-summary-data" ]] || tar -xzf "$DOWNLOAD/XSUM-EMNLP18-Summary-Data-Original.tar.gz" -C "$DOWNLOAD"
}

convert() {
  local split name
  for split in train valid test; do
    name=$([[ $split == valid ]] && echo validation || echo "$split")
    "$BIN/palm-prepare" xsum --data-dir "$DOWNLOAD/bbc-summary-data" \
      --split-file "$DOWNLOAD/XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json" --split "$name" --out "$WORK/raw/$split"
  done
}

main "$@"
