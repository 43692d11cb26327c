#!/usr/bin/env bash
# Gigaword headline generation (Rush et al. 2015 split; full 3.8M or the 10K low-resource training set).
#   MODEL=palm|unilm|unilm2 [TRAIN_SET=full|10k] [SMOKE=1] [STAGES="..."] bash examples/gigaword/run.sh
BENCHMARK=gigaword
METRICS="rouge"
ROUGE_ARGS="--sentence-split none"  # one-sentence headlines
TRAIN_SET="${TRAIN_SET:-full}"
source "$(dirname "$0")/../common.sh"
WORK="$WORK-$TRAIN_SET"

# UniLM section 3.1 (30 epochs, batch 64, mask 0.7, label smoothing 0.1, maximum length 256 with the source cut to
# 192, beam 5, trigram blocking). PALM section 3.4: its generative QA settings (section 3.3) with UniLM's lengths
# (Gigaword sources are one sentence). UniLMv2 did not report Gigaword: its CNN/DM optimiser settings (Table 10)
# with UniLM's lengths.
LABEL_SMOOTHING=0.1; WEIGHT_DECAY=0.01; MIN_LEN=1; NO_REPEAT_NGRAM=3
case "$MODEL" in
  palm)   ARCH=${ARCH:-palm_base};   LR=1e-5; TOTAL_BATCH=64; EPOCHS=10; WARMUP_RATIO=0.02
          MAX_SOURCE=192; MAX_TARGET=64; BEAM=5; LENPEN=1.0; MAX_LEN_B=32 ;;
  unilm)  ARCH=${ARCH:-unilm_large}; LR=3e-5; TOTAL_BATCH=64; EPOCHS=30; WARMUP_RATIO=0.02; MASK_PROB=0.7
          MAX_SOURCE=192; MAX_TARGET=64; BEAM=5; LENPEN=0; MAX_LEN_B=32 ;;
  unilm2) ARCH=${ARCH:-unilm2_base}; LR=7e-5; TOTAL_BATCH=64; EPOCHS=14; WARMUP_RATIO=0.02
          MAX_SOURCE=192; MAX_TARGET=64; BEAM=5; LENPEN=0; MAX_LEN_B=32 ;;
esac
# Decoding of unilm/unilm2 follows the authors' code: UniLM v1's decode_seq2seq.py (unilm-v1 README, Gigaword) sums
# log-probabilities (--length_penalty 0: LENPEN=0), outputs at most 32 tokens and blocks repeated trigrams except
# those holding "." (--forbid_ignore_word "."); UniLMv2 (no Gigaword setting) decodes the same way.
if [[ "$MODEL" != palm ]]; then NGRAM_IGNORE="."; fi

# harvardnlp's release of Rush et al.'s data (summary.tar.gz, on Google Drive: https://github.com/harvardnlp/sent-summary)
# unpacks to sumdata/train/{train,valid}.{article,title}*.txt and Giga/{input,task1_ref0}.txt under $DOWNLOAD.
download() {
  [[ -f "$DOWNLOAD/sumdata/train/train.article.txt" && -f "$DOWNLOAD/Giga/input.txt" ]] || die "unpack \
summary.tar.gz (https://github.com/harvardnlp/sent-summary) into $DOWNLOAD"
}

convert() {
  local train="$DOWNLOAD/sumdata/train"
  "$BIN/palm-prepare" gigaword --source "$train/train.article.txt" --target "$train/train.title.txt" \
    --out "$WORK/raw/train"
  "$BIN/palm-prepare" gigaword --source "$train/valid.article.filter.txt" --target "$train/valid.title.filter.txt" \
    --out "$WORK/raw/valid"
  "$BIN/palm-prepare" gigaword --source "$DOWNLOAD/Giga/input.txt" --target "$DOWNLOAD/Giga/task1_ref0.txt" \
    --out "$WORK/raw/test"
  if [[ "$TRAIN_SET" == 10k ]]; then  # UniLM Table 4's low-resource setting: the first 10K training pairs
    local side
    for side in src tgt; do head -n 10000 "$WORK/raw/train.$side" > "$WORK/raw/train10k.$side"; done
    for side in src tgt; do mv "$WORK/raw/train10k.$side" "$WORK/raw/train.$side"; done
  fi
}

main "$@"
