#!/usr/bin/env bash
# Cornell Movie-Dialogs response generation, perplexity of the test responses (PALM section 3.6, Table 5: 10K and
# full (110K) training sets; MASS's split: 10K validation and 20K test pairs at random).
#   MODEL=palm|unilm|unilm2 [TRAIN_SET=full|10k] [SMOKE=1] [STAGES="..."] bash examples/cornell/run.sh
BENCHMARK=cornell
TRAIN_SET="${TRAIN_SET:-full}"
source "$(dirname "$0")/../common.sh"
source "$EXAMPLES/dialog.sh"
WORK="$WORK-$TRAIN_SET"

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
