#!/usr/bin/env bash
# Dialog response generation on the embedded chitchat-dataset conversations (installed with the project, no
# download): perplexity of the test responses, as for Cornell (PALM section 3.6), with the full or 10K-pair
# training set. palm-data (palm_tools/data/corpora.py) splits the conversations (not the pairs) into train/valid/test and makes
# the sentencepiece vocabulary and dictionary that models pre-trained here (make demo) use, so by default the
# recipe tokenises with those (VOCAB=sentencepiece); PREPARED=data reuses the output of `make data`.
#   MODEL=palm|unilm|unilm2 [TRAIN_SET=full|10k] [PALM_CHECKPOINT=...|FROM_SCRATCH=1] [SMOKE=1] [STAGES="..."] \
#     bash examples/chitchat/run.sh
BENCHMARK=chitchat
TRAIN_SET="${TRAIN_SET:-full}"
VOCAB="${VOCAB:-sentencepiece}"
source "$(dirname "$0")/../common.sh"
source "$EXAMPLES/dialog.sh"
WORK="$WORK-$TRAIN_SET"
PREPARED="${PREPARED:-$WORK/prepared}"
if [[ "$VOCAB" == sentencepiece ]]; then
  SPM_MODEL="${SPM_MODEL:-$PREPARED/spm/spm.model}"
  DICT="${DICT:-$PREPARED/dict.txt}"
fi

download() { "$PYTHON" -c "import chitchat_dataset" || die "pip install chitchat-dataset (make env installs it)"; }

convert() {
  local inputs=()
  [[ "$SMOKE" == 1 ]] && inputs=(--dialog-json "$DOWNLOAD/dialog.json" --pretrain-text "$DOWNLOAD/pretrain.txt"
                                 --vocab-size 200)
  "$BIN/palm-data" --out "$PREPARED" "${inputs[@]}"  # idempotent: reuses finished stages
  mkdir -p "$WORK/raw"
  local split side train=chitchat
  [[ "$TRAIN_SET" == 10k ]] && train=chitchat10k
  for side in src tgt; do
    cp "$PREPARED/raw/$train.train.$side" "$WORK/raw/train.$side"
    for split in valid test; do cp "$PREPARED/raw/chitchat.$split.$side" "$WORK/raw/$split.$side"; done
  done
}

main "$@"
