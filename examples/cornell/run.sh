#!/usr/bin/env bash
# Cornell Movie-Dialogs response generation, perplexity of the test responses (PALM section 3.6, Table 5: 10K and
# full (110K) training sets; MASS's split: 10K validation and 20K test pairs at random).
#   MODEL=palm [TRAIN_SET=full|10k] [SMOKE=1] [STAGES="..."] bash examples/cornell/run.sh
BENCHMARK=cornell
METRICS="ppl"
SCORE_REFERENCE=1  # decode = score the reference responses (fairseq-generate --score-reference)
TRAIN_SET="${TRAIN_SET:-full}"
source "$(dirname "$0")/../common.sh"
WORK="$WORK-$TRAIN_SET"

# PALM: "the same training hyperparameters from generative QA fine-tuning" (10 epochs, batch 64, lr 1e-5).
LABEL_SMOOTHING=0.1; WEIGHT_DECAY=0.01; MIN_LEN=1; BEAM=1; LENPEN=1.0; MAX_LEN_B=32
case "$MODEL" in
  palm)   ARCH=${ARCH:-palm_base};   LR=1e-5; TOTAL_BATCH=64; EPOCHS=10; WARMUP_RATIO=0.02
          MAX_SOURCE=128; MAX_TARGET=64 ;;
  # perplexity needs fairseq-generate --score-reference, which scores with model(**net_input): the unilm model's
  # forward does not take the unilm_seq2seq batch, so this recipe is for PALM (PALM Table 5 compares PALM, MASS
  # and BERT+LM)
  *)      die "perplexity recipes support MODEL=palm only" ;;
esac
SPLIT_SIZES=(--valid-size 10000 --test-size 20000)
[[ "$SMOKE" == 1 ]] && SPLIT_SIZES=(--valid-size 20 --test-size 20)

download() {
  fetch https://www.cs.cornell.edu/~cristian/data/cornell_movie_dialogs_corpus.zip \
    "$DOWNLOAD/cornell_movie_dialogs_corpus.zip"
  [[ -d "$DOWNLOAD/cornell movie-dialogs corpus" ]] || (cd "$DOWNLOAD" && unzip -q cornell_movie_dialogs_corpus.zip)
}

convert() {
  local corpus="$DOWNLOAD/cornell movie-dialogs corpus" side
  "$BIN/palm-prepare" cornell --lines "$corpus/movie_lines.txt" --conversations "$corpus/movie_conversations.txt" \
    "${SPLIT_SIZES[@]}" --out-dir "$WORK/raw"
  if [[ "$TRAIN_SET" == 10k ]]; then
    for side in src tgt; do cp "$WORK/raw/train10k.$side" "$WORK/raw/train.$side"; done
  fi
}

main "$@"
