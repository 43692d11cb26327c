#!/usr/bin/env bash
# Dialog response generation on the embedded chitchat-dataset conversations (installed with the project, no
# download): perplexity of the test responses, as for Cornell (PALM section 3.6), with the full or 10K-pair
# training set. scripts/prepare_data.py splits the conversations (not the pairs) into train/valid/test.
#   MODEL=palm [TRAIN_SET=full|10k] [SMOKE=1] [STAGES="..."] bash examples/chitchat/run.sh
BENCHMARK=chitchat
METRICS="ppl"
SCORE_REFERENCE=1
TRAIN_SET="${TRAIN_SET:-full}"
source "$(dirname "$0")/../common.sh"
WORK="$WORK-$TRAIN_SET"

LABEL_SMOOTHING=0.1; WEIGHT_DECAY=0.01; MIN_LEN=1; BEAM=1; LENPEN=1.0; MAX_LEN_B=32
case "$MODEL" in
  palm)   ARCH=${ARCH:-palm_base};   LR=1e-5; TOTAL_BATCH=64; EPOCHS=10; WARMUP_RATIO=0.02
          MAX_SOURCE=128; MAX_TARGET=64 ;;
  # perplexity needs fairseq-generate --score-reference, which scores with model(**net_input): the unilm model's
  # forward does not take the unilm_seq2seq batch, so this recipe is for PALM (PALM Table 5 compares PALM, MASS
  # and BERT+LM)
  *)      die "perplexity recipes support MODEL=palm only" ;;
esac

download() { "$PYTHON" -c "import chitchat_dataset" || die "pip install chitchat-dataset (make env installs it)"; }

convert() {
  local inputs=()
  [[ "$SMOKE" == 1 ]] && inputs=(--dialog-json "$DOWNLOAD/dialog.json" --pretrain-text "$DOWNLOAD/pretrain.txt"
                                 --vocab-size 200)
  "$PYTHON" "$REPO/scripts/prepare_data.py" --out "$WORK/prepared" "${inputs[@]}"
  mkdir -p "$WORK/raw"
  local split side train=chitchat
  [[ "$TRAIN_SET" == 10k ]] && train=chitchat10k
  for side in src tgt; do
    cp "$WORK/prepared/raw/$train.train.$side" "$WORK/raw/train.$side"
    for split in valid test; do cp "$WORK/prepared/raw/chitchat.$split.$side" "$WORK/raw/$split.$side"; done
  done
}

main "$@"
