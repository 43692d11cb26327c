# Stages shared by the benchmark recipes (sourced by examples/<benchmark>/run.sh; see examples/README.md).
#
# A recipe sets BENCHMARK, METRICS (palm-score subcommands), the papers' hyper-parameters for each MODEL, and
# defines two functions:
#   download   fetch the raw release into $DOWNLOAD (on your machine; SMOKE=1 writes small files instead)
#   convert    $DOWNLOAD -> $WORK/raw/{train,valid,test}.{src,tgt} with palm-prepare
# then calls `main "$@"`. Stages: download convert tokenize binarize train decode score (STAGES="..." picks some).
#
# MODEL (the model family; the variables each one reads):
#   palm    fairseq `translation` task, `palm_base`/`palm_large`, GPT-2 BPE: GPT2_DIR (encoder.json, vocab.bpe,
#           dict.txt), PALM_CHECKPOINT (a PALM pre-trained checkpoint; fine-tuning starts from it) or, without
#           one, ROBERTA_CHECKPOINT (the encoder is initialised from RoBERTa, as PALM does before pre-training)
#   unilm   `unilm_seq2seq`, `unilm_large`, WordPiece: UNILM_DIR = output of palm-convert bert (model.pt, dict.txt,
#           vocab.txt, tokenizer_config.json) on the released UniLM v1 checkpoint
#   unilm2  `unilm_seq2seq --pseudo-masks`, `unilm2_base`, WordPiece: UNILM_DIR as above for UniLMv2
#   Fine-tuning adopts the converted checkpoint's sizes and segment ids; tokenisation and decoding use its casing
#   (tokenizer_config.json). POSITIONS (the papers' 768 for CNN/DM and XSum) grows the checkpoint's 512 position
#   embeddings as the authors' fine-tuning code does.
# VOCAB (how text becomes subwords; default gpt2 for palm, wordpiece for unilm/unilm2):
#   gpt2 | wordpiece    as above (the released checkpoints' vocabularies)
#   sentencepiece       SPM_MODEL (a sentencepiece model) and DICT (the fairseq dictionary the model was trained
#                       with), e.g. those of palm-data for models pre-trained here
# FROM_SCRATCH=1 trains without a pre-trained checkpoint (PALM Table 6's "- pre-training" ablation).
# Hyper-parameters: each recipe sets the papers' values; any of $HYPERPARAMETERS (below) set in the environment
# wins, e.g. `LR=5e-4 EPOCHS=2 bash examples/chitchat/run.sh`.
# SMOKE=1 runs every stage on small files in the benchmark's raw format (examples/smoke_data.py, real text from
# the embedded corpora), with a sentencepiece vocabulary trained on them, the family's tiny architecture trained
# from scratch for a few updates, and a short beam search: it checks the plumbing, not the scores.

set -euo pipefail

EXAMPLES="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$EXAMPLES")"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
if [[ -z "${BIN:-}" ]]; then
  command -v fairseq-train >/dev/null || { echo "fairseq-train is not on PATH: source .venv/bin/activate (make env)" \
    "or set BIN to the folder of the fairseq and palm-* commands" >&2; exit 1; }
  BIN="$(dirname "$(command -v fairseq-train)")"
fi
PYTHON="${PYTHON:-$BIN/python}"
USER_DIR="$REPO/palm_plugin"

MODEL="${MODEL:-palm}"
SMOKE="${SMOKE:-0}"
# work/<benchmark>/download (the raw release) and work/<benchmark>/<model> (everything made from it); SMOKE=1 uses
# work/smoke/<benchmark>
SMOKE_FOLDER=""
[[ "$SMOKE" == 1 ]] && SMOKE_FOLDER=/smoke
ROOT="${ROOT:-$REPO/work$SMOKE_FOLDER/$BENCHMARK}"
DOWNLOAD="${DOWNLOAD:-$ROOT/download}"
WORK="${WORK:-$ROOT/$MODEL}"
STAGES="${STAGES:-download convert tokenize binarize train decode score}"
NGPUS="${NGPUS:-$( (nvidia-smi -L 2>/dev/null || true) | grep -c GPU || true)}"
WORKERS="${WORKERS:-4}"
GPT2_DIR="${GPT2_DIR:-$REPO/work/gpt2}"
PALM_CHECKPOINT="${PALM_CHECKPOINT:-}"
ROBERTA_CHECKPOINT="${ROBERTA_CHECKPOINT:-}"
UNILM_DIR="${UNILM_DIR:-}"
BATCH_SIZE="${BATCH_SIZE:-8}"  # sentences per GPU per step; --update-freq makes up the papers' total batch
CHECKPOINT="${CHECKPOINT:-checkpoint_best.pt}"
VOCAB="${VOCAB:-$([[ "$MODEL" == palm ]] && echo gpt2 || echo wordpiece)}"
SPM_MODEL="${SPM_MODEL:-}"
DICT="${DICT:-}"
FROM_SCRATCH="${FROM_SCRATCH:-0}"

# The recipes' hyper-parameters; the values set in the environment are kept here and applied (in main) after the
# recipe and SMOKE=1 set theirs.
HYPERPARAMETERS="LR TOTAL_BATCH EPOCHS MAX_UPDATE WARMUP_RATIO MASK_PROB LABEL_SMOOTHING WEIGHT_DECAY MAX_SOURCE
  MAX_TARGET BEAM LENPEN LENPEN_STYLE MIN_LEN MAX_LEN_B NO_REPEAT_NGRAM NGRAM_IGNORE"
FROM_ENVIRONMENT="$(for v in $HYPERPARAMETERS; do [[ -n "${!v:-}" ]] && printf '%s=%q; ' "$v" "${!v}"; done || true)"

log() { echo "[$BENCHMARK/$MODEL] $*" >&2; }
die() { echo "[$BENCHMARK/$MODEL] error: $*" >&2; exit 1; }
need_file() { [[ -f "$1" ]] || die "missing $1: $2"; }
fetch() {  # fetch URL FILE: download once
  [[ -s "$2" ]] && return 0
  mkdir -p "$(dirname "$2")"
  log "downloading $1"
  if command -v wget >/dev/null; then wget -q -O "$2.part" "$1"; else curl -fsSL -o "$2.part" "$1"; fi
  mv "$2.part" "$2"
}

# SMOKE=1: small raw files instead of the download (main), and tiny hyper-parameters, applied after the recipe set
# its own
smoke_overrides() {
  EPOCHS=1; MAX_UPDATE=4; TOTAL_BATCH=4; BATCH_SIZE=4; WARMUP_RATIO=0; BEAM=2; MAX_LEN_B=16; MIN_LEN=1
  MAX_SOURCE=128; MAX_TARGET=96; NGPUS=0; FROM_SCRATCH=1; VOCAB=sentencepiece
  # a small vocabulary trained on the smoke files (tokenize), unless the recipe brings its own
  [[ -n "$SPM_MODEL" ]] || { SPM_MODEL="$WORK/tok/spm.model"; TRAIN_SPM=1; }
  case "$MODEL" in
    palm) ARCH=palm_tiny ;;
    unilm) ARCH=unilm_tiny ;;
    unilm2) ARCH=unilm2_tiny ;;
  esac
}

# ------------------------------------------------------------------------------------------------ tokenisation
tokenize() {
  local tok="$WORK/tok" files=() outputs=() split side
  for split in train valid test; do
    for side in src tgt; do files+=("$WORK/raw/$split.$side"); outputs+=("$tok/$split.$side"); done
  done
  mkdir -p "$tok"
  encode_files "$WORK/raw/train.src $WORK/raw/train.tgt" "${files[@]}" "${outputs[@]}"
}

# encode_files "SENTENCEPIECE TRAINING FILES" INPUT... OUTPUT...: the INPUT files in subwords (VOCAB), into as many
# OUTPUT files; with TRAIN_SPM=1 a small sentencepiece model is trained on the training files first
encode_files() {
  local spm_training="$1"; shift
  local half=$(( $# / 2 ))
  local files=("${@:1:half}") outputs=("${@:half+1}")
  case "$VOCAB" in
    sentencepiece)
      if [[ "${TRAIN_SPM:-0}" == 1 ]]; then
        # shellcheck disable=SC2086
        "$PYTHON" - $spm_training "${SPM_MODEL%.model}" <<'EOF'
import sys, sentencepiece as spm
spm.SentencePieceTrainer.train(input=sys.argv[1:-1], model_prefix=sys.argv[-1], vocab_size=300, minloglevel=2,
                               character_coverage=1.0, hard_vocab_limit=False)
EOF
      fi
      need_file "$SPM_MODEL" "set SPM_MODEL to the sentencepiece model the checkpoint was trained with"
      "$BIN/palm-prepare" encode --bpe sentencepiece --model "$SPM_MODEL" --workers "$WORKERS" \
        --inputs "${files[@]}" --outputs "${outputs[@]}" ;;
    gpt2)
      fetch https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/encoder.json "$GPT2_DIR/encoder.json"
      fetch https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/vocab.bpe "$GPT2_DIR/vocab.bpe"
      fetch https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/dict.txt "$GPT2_DIR/dict.txt"
      "$BIN/palm-prepare" encode --bpe gpt2 --model "$GPT2_DIR/encoder.json" --vocab-bpe "$GPT2_DIR/vocab.bpe" \
        --workers "$WORKERS" --inputs "${files[@]}" --outputs "${outputs[@]}" ;;
    wordpiece)
      need_file "$UNILM_DIR/vocab.txt" "set UNILM_DIR to the output of palm-convert bert"
      # casing: the tokenizer_config.json palm-convert wrote beside vocab.txt
      "$BIN/palm-prepare" encode --bpe wordpiece --model "$UNILM_DIR/vocab.txt" \
        --workers "$WORKERS" --inputs "${files[@]}" --outputs "${outputs[@]}" ;;
    *) die "VOCAB must be gpt2, wordpiece or sentencepiece" ;;
  esac
}

dictionary() {  # the model's fixed dictionary; empty: fairseq-preprocess builds one from the training split
  case "$VOCAB" in
    gpt2) echo "$GPT2_DIR/dict.txt" ;;
    wordpiece) echo "$UNILM_DIR/dict.txt" ;;
    sentencepiece) echo "$DICT" ;;
  esac
}

wordpiece_cased() {  # 1 when the converted checkpoint's vocabulary is cased (what palm-prepare encode used)
  "$PYTHON" -c 'import sys; from pathlib import Path; from palm_tools.data.encode import lower_case
vocab = Path(sys.argv[1]); print(int(not lower_case(vocab.parent, vocab.read_text(encoding="utf-8").split())[0]))' \
    "$UNILM_DIR/vocab.txt"
}

bpe_args() {  # how fairseq-generate turns subwords back into text
  case "$VOCAB" in
    sentencepiece) echo "--bpe sentencepiece --sentencepiece-model $SPM_MODEL" ;;
    gpt2) echo "--bpe gpt2 --gpt2-encoder-json $GPT2_DIR/encoder.json --gpt2-vocab-bpe $GPT2_DIR/vocab.bpe" ;;
    wordpiece) echo "--bpe bert --bpe-vocab-file $UNILM_DIR/vocab.txt$([[ "$(wordpiece_cased)" == 1 ]] && echo " --bpe-cased")" ;;
  esac
}

ignore_symbols() {  # NGRAM_IGNORE's words as dictionary symbols: GPT-2's dictionary holds BPE ids
  case "$VOCAB" in
    gpt2) "$PYTHON" -c 'import json, sys; ids = json.load(open(sys.argv[1]))
print("|".join(str(ids[w]) for w in sys.argv[2].split("|")))' "$GPT2_DIR/encoder.json" "$NGRAM_IGNORE" ;;
    *) echo "$NGRAM_IGNORE" ;;
  esac
}

binarize() {
  local dict
  dict="$(dictionary)"
  local dict_args=(--joined-dictionary)
  [[ -n "$dict" ]] && dict_args=(--srcdict "$dict" --tgtdict "$dict")
  rm -rf "$WORK/bin.tmp"
  "$BIN/fairseq-preprocess" --source-lang src --target-lang tgt --trainpref "$WORK/tok/train" \
    --validpref "$WORK/tok/valid" --testpref "$WORK/tok/test" --destdir "$WORK/bin.tmp" "${dict_args[@]}" \
    --workers "$WORKERS"
  rm -rf "$WORK/bin" && mv "$WORK/bin.tmp" "$WORK/bin"
}

# ---------------------------------------------------------------------------------------------------- training
task_args() {  # the task options shared by training and decoding; $1 = the longest reference allowed
  local max_target="${1:-$MAX_TARGET}"
  case "$MODEL" in
    palm) echo "--task translation --source-lang src --target-lang tgt --truncate-source \
      --max-source-positions $MAX_SOURCE --max-target-positions $max_target" ;;
    unilm) echo "--task unilm_seq2seq --max-source-positions $MAX_SOURCE --max-target-positions $MAX_TARGET" ;;
    unilm2) echo "--task unilm_seq2seq --pseudo-masks --max-source-positions $MAX_SOURCE \
      --max-target-positions $MAX_TARGET" ;;
  esac
}

training_device() {  # fairseq-train's device options: fairseq's Adam on the CPU; fp16 and torch's fused AdamW on GPUs
  # (the same update as fairseq's Adam, 1.08-1.18x faster steps on an H100 / H200 than fairseq's per-parameter Adam,
  # which the plugin has run as multi-tensor operations since: docs/gpu.md)
  if [[ "$NGPUS" == 0 ]]; then echo "--cpu --optimizer adam"; else echo "--fp16 --optimizer torch_adamw"; fi
}

train() {
  local per_step=$(( BATCH_SIZE * (NGPUS > 0 ? NGPUS : 1) ))
  local update_freq=$(( (TOTAL_BATCH + per_step - 1) / per_step ))
  local examples steps_per_epoch total warmup
  examples=$(wc -l < "$WORK/raw/train.src")
  steps_per_epoch=$(( (examples + TOTAL_BATCH - 1) / TOTAL_BATCH ))
  total=$(( steps_per_epoch * EPOCHS ))
  local stop=(--max-epoch "$EPOCHS")  # fairseq skips over-long pairs, so the updates may fall short of the count
  if [[ -n "${MAX_UPDATE:-}" ]]; then total=$MAX_UPDATE; stop=(); fi
  warmup=$(awk -v r="$WARMUP_RATIO" -v t="$total" 'BEGIN { printf "%d", r * t }')
  local init=() model=() device=()
  read -ra device <<< "$(training_device)"
  case "$MODEL" in
    palm)
      model=(--arch "$ARCH" --criterion label_smoothed_cross_entropy --label-smoothing "$LABEL_SMOOTHING"
             --skip-invalid-size-inputs-valid-test)
      if [[ "$FROM_SCRATCH" != 1 ]]; then
        if [[ -n "$PALM_CHECKPOINT" ]]; then init=(--finetune-from-model "$PALM_CHECKPOINT")
        else need_file "$ROBERTA_CHECKPOINT" "set PALM_CHECKPOINT or ROBERTA_CHECKPOINT (or FROM_SCRATCH=1)"
             init=(--roberta-path "$ROBERTA_CHECKPOINT"); fi
      fi ;;
    unilm | unilm2)
      model=(--arch "$ARCH" --criterion unilm_cloze --label-smoothing "$LABEL_SMOOTHING")
      # UniLM v1 predicts MASK_PROB of the target; UniLMv2's layout (--pseudo-masks) predicts every target token
      [[ "$MODEL" == unilm ]] && model+=(--mask-prob "$MASK_PROB")
      if [[ "$FROM_SCRATCH" != 1 ]]; then
        need_file "$UNILM_DIR/model.pt" "set UNILM_DIR to a converted checkpoint (or FROM_SCRATCH=1)"
        init=(--finetune-from-model "$UNILM_DIR/model.pt")  # its sizes and segment ids are adopted
      elif [[ "$MODEL" == unilm2 ]]; then
        model+=(--source-segment 0 --target-segment 1)  # UniLMv2's two segment types
      fi
      [[ -n "${POSITIONS:-}" ]] && model+=(--max-positions "$POSITIONS") ;;
  esac
  log "training: $examples examples, $total updates ($EPOCHS epochs of $steps_per_epoch), warmup $warmup, lr $LR," \
    "$TOTAL_BATCH pairs per update, from ${init[*]:-scratch}"
  # shellcheck disable=SC2046
  "$BIN/fairseq-train" "$WORK/bin" --user-dir "$USER_DIR" $(task_args) "${model[@]}" "${init[@]}" "${device[@]}" \
    --adam-betas "(0.9, 0.999)" --adam-eps 1e-8 --weight-decay "$WEIGHT_DECAY" --clip-norm 1.0 \
    --lr "$LR" --lr-scheduler polynomial_decay --warmup-updates "$warmup" --total-num-update "$total" \
    --max-update "$total" "${stop[@]}" --batch-size "$BATCH_SIZE" --update-freq "$update_freq" --dropout 0.1 \
    --attention-dropout 0.1 --save-dir "$WORK/checkpoints" --no-epoch-checkpoints --log-format simple \
    --log-interval 100 --seed 1 --num-workers 0 ${TRAIN_EXTRA:-} 2>&1 | tee "$WORK/train.log"
  # what fairseq changed in the data: pairs cut to the task's lengths, pairs dropped as longer than the model
  local truncated skipped
  truncated="$(grep -o 'train: [0-9]* pairs; truncated [0-9]* sources.* [0-9]* targets to --max-target-positions [0-9]*' \
    "$WORK/train.log" | head -1 || true)"
  skipped="$(grep -o '[0-9]* samples have invalid sizes' "$WORK/train.log" | head -1 | cut -d' ' -f1 || true)"
  log "training data: ${truncated:-no truncation reported}; skipped ${skipped:-0} pairs longer than the model's" \
    "positions"
}

# ---------------------------------------------------------------------------------------------------- decoding
decode() {
  mkdir -p "$WORK/gen"
  local device=()
  [[ "$NGPUS" == 0 ]] && device=(--cpu)
  # LENPEN_STYLE: fairseq (divide by len ** LENPEN) or gnmt (by ((5 + len) / 6) ** LENPEN, s2s-ft's formula);
  # NGRAM_IGNORE: words ('|'-separated) whose n-grams NO_REPEAT_NGRAM never blocks (s2s-ft's --forbid_ignore_word)
  local search=(--beam "$BEAM" --lenpen "$LENPEN" --lenpen-style "${LENPEN_STYLE:-fairseq}" --min-len "$MIN_LEN"
                --max-len-b "$MAX_LEN_B")
  [[ "${NO_REPEAT_NGRAM:-0}" != 0 ]] && search+=(--no-repeat-ngram-size "$NO_REPEAT_NGRAM")
  [[ "${NO_REPEAT_NGRAM:-0}" != 0 && -n "${NGRAM_IGNORE:-}" ]] && search+=(--no-repeat-ngram-ignore "$(ignore_symbols)")
  [[ "${SCORE_REFERENCE:-0}" == 1 ]] && search=(--score-reference)
  # shellcheck disable=SC2046
  # translation would refuse test examples whose reference is longer than training allowed: decoding does not
  # read the reference (scoring reads the raw file), so any length up to the decoder's 512 positions is fine
  "$BIN/fairseq-generate" "$WORK/bin" --user-dir "$USER_DIR" $(task_args 512) $(bpe_args) "${device[@]}" \
    --path "$WORK/checkpoints/$CHECKPOINT" --gen-subset test "${search[@]}" --batch-size "$BATCH_SIZE" \
    --required-batch-size-multiple 1 --num-workers 0 > "$WORK/gen/test.out.tmp"
  mv "$WORK/gen/test.out.tmp" "$WORK/gen/test.out"
}

score() {
  local metric
  for metric in $METRICS; do
    case "$metric" in
      ppl) "$BIN/palm-score" ppl --generate "$WORK/gen/test.out" --out "$WORK/scores.$metric.json" ;;
      *) local options="${metric^^}_ARGS"  # e.g. BLEU_ARGS="--tokenize none --lowercase"
         # shellcheck disable=SC2086
         "$BIN/palm-score" "$metric" --generate "$WORK/gen/test.out" --ref "$WORK/raw/test.tgt" \
           --out "$WORK/scores.$metric.json" ${!options:-} ;;
    esac
  done
}

# ------------------------------------------------------------------------------------------ checks, then the stages
# Bad settings stop the recipe with one line that says what to give, before a stage runs: bash would otherwise read
# a word as 0 in its arithmetic (TOTAL_BATCH=abc: a division by zero; EPOCHS=abc: --max-update 0, no limit at all).
check_settings() {  # check_settings NAME...: MODEL, NGPUS, WARMUP_RATIO, and each NAME set a whole number of 1 or more
  case "$MODEL" in palm | unilm | unilm2) ;; *) die "MODEL=$MODEL: choose palm, unilm or unilm2" ;; esac
  [[ "$NGPUS" =~ ^[0-9]+$ ]] || die "NGPUS=$NGPUS: give the number of GPUs to train on (0: the CPU)"
  [[ -z "${WARMUP_RATIO:-}" || "$WARMUP_RATIO" =~ ^(0|1|0?\.[0-9]+)$ ]] ||
    die "WARMUP_RATIO=$WARMUP_RATIO: give the share of the updates that warm up, from 0 to 1 (e.g. 0.02)"
  local name
  for name in "$@"; do
    [[ -z "${!name:-}" || "${!name}" =~ ^[1-9][0-9]*$ ]] || die "$name=${!name}: give a whole number of 1 or more"
  done
}

# stage_inputs STAGE: lines "WRITER FILE", the files STAGE reads and the stage that writes each (a recipe with other
# stages defines its own)
stage_inputs() {
  local split side
  case "$1" in
    tokenize | binarize)
      local folder=raw writer=convert
      [[ "$1" == binarize ]] && { folder=tok; writer=tokenize; }
      for split in train valid test; do
        for side in src tgt; do echo "$writer $WORK/$folder/$split.$side"; done
      done ;;
    train) echo "convert $WORK/raw/train.src"; echo "binarize $WORK/bin/dict.src.txt" ;;
    decode) echo "binarize $WORK/bin/dict.src.txt"; echo "train $WORK/checkpoints/$CHECKPOINT" ;;
    score) echo "decode $WORK/gen/test.out"; [[ "$METRICS" == ppl ]] || echo "convert $WORK/raw/test.tgt" ;;
  esac
}

stages_between() {  # stages_between FIRST LAST "STAGES": the stages from FIRST to LAST
  local stage on=0 between=()
  for stage in $3; do
    [[ "$stage" == "$1" ]] && on=1
    (( on )) && between+=("$stage")
    [[ "$stage" == "$2" ]] && break
  done
  echo "${between[*]}"
}

# run_stages "THE RECIPE'S STAGES": the stages of $STAGES in their order, each once its inputs are there
run_stages() {
  local stage writer file
  for stage in $STAGES; do
    [[ " $1 " == *" $stage "* ]] || die "STAGES: there is no stage '$stage'; the stages are: $1"
  done
  for stage in $STAGES; do
    while read -r writer file; do
      [[ -e "$file" ]] || die "stage $stage reads $file, which is not there: run the stage $writer first" \
        "(STAGES=\"$(stages_between "$writer" "$stage" "$1")\"), with the same MODEL and ROOT"
    done < <(stage_inputs "$stage")
    log "stage $stage"
    if [[ "$stage" == download && "$SMOKE" == 1 ]]; then
      "$PYTHON" "$EXAMPLES/smoke_data.py" "$BENCHMARK" "$DOWNLOAD"
    else
      "$stage"
    fi
  done
}

main() {
  [[ "$SMOKE" == 1 ]] && smoke_overrides
  eval "$FROM_ENVIRONMENT"
  check_settings TOTAL_BATCH BATCH_SIZE EPOCHS MAX_UPDATE
  mkdir -p "$WORK"
  run_stages "download convert tokenize binarize train decode score"
}
