#!/usr/bin/env bash
# CNN/DailyMail abstractive summarisation, non-anonymised (See et al. 2017). See examples/README.md.
#   MODEL=palm|unilm|unilm2 [SMOKE=1] [STAGES="..."] bash examples/cnndm/run.sh
BENCHMARK=cnndm
METRICS="rouge"
source "$(dirname "$0")/../common.sh"

# Which settings are the papers' and which are ours (PAPER = stated in the paper; AUTHORS = the authors' released
# scripts; OURS = our choice where neither says):
#   palm   PAPER (section 3.4 takes its generative QA settings, section 3.3): 10 epochs, batch 64, lr 1e-5, input 512,
#          beam 5. AUTHORS (AliceMind's PALM/finetune_cnndm_task_roberta.sh; docs/palm-authors-code.md): the GNMT
#          length penalty with alpha 0.95, min length 40, max length 130, no trigram blocking (block_trigram is off
#          by default), label smoothing 0.1, no weight decay. OURS: warm-up 2%, target 160.
#   unilm  PAPER (UniLM section 3.1): 30 epochs, batch 32, mask 0.7, label smoothing 0.1, source 640 of 768 tokens,
#          beam 5, trigram blocking, the other settings as in pre-training (lr 3e-5, weight decay 0.01). OURS: warm-up
#          2%, min length 1.
#   unilm2 PAPER (UniLMv2 appendix Table 10): lr 7e-5, batch 64, 14 epochs, warm-up 2%, input 608, output 160,
#          beam 5, length penalty 0.7, label smoothing 0.1, weight decay 0.01 (the table's "0.01" as we read it).
#          OURS: trigram blocking (s2s-ft has the option; the paper does not say), min length 1.
LABEL_SMOOTHING=0.1; WEIGHT_DECAY=0.01; MIN_LEN=1; NO_REPEAT_NGRAM=3
case "$MODEL" in
  palm)   ARCH=${ARCH:-palm_base};   LR=1e-5; TOTAL_BATCH=64; EPOCHS=10; WARMUP_RATIO=0.02
          MAX_SOURCE=512; MAX_TARGET=160; BEAM=5; LENPEN=0.95; LENPEN_STYLE=gnmt; MIN_LEN=40; MAX_LEN_B=130
          NO_REPEAT_NGRAM=0; WEIGHT_DECAY=0 ;;
  unilm)  ARCH=${ARCH:-unilm_large}; LR=3e-5; TOTAL_BATCH=32; EPOCHS=30; WARMUP_RATIO=0.02; MASK_PROB=0.7
          MAX_SOURCE=640; MAX_TARGET=128; BEAM=5; LENPEN=0; MAX_LEN_B=128 ;;
  unilm2) ARCH=${ARCH:-unilm2_base}; LR=7e-5; TOTAL_BATCH=64; EPOCHS=14; WARMUP_RATIO=0.02
          MAX_SOURCE=608; MAX_TARGET=160; BEAM=5; LENPEN=0.7; LENPEN_STYLE=gnmt; MAX_LEN_B=160 ;;
esac
# Decoding of unilm/unilm2 follows the authors' code: UniLM v1's decode_seq2seq.py (unilm-v1 README, CNN/DM) sums
# log-probabilities (--length_penalty 0: LENPEN=0) and blocks repeated trigrams except those holding "."
# (--forbid_ignore_word ".|[X_SEP]"; our data has no [X_SEP] separator); UniLMv2's s2s-ft divides by the GNMT
# penalty ((5 + len) / 6) ** 0.7 (LENPEN_STYLE=gnmt) and blocks trigrams alike. Ours: MIN_LEN 1 (the s2s-ft README
# uses --min_len 48 for UniLM v1.2).
if [[ "$MODEL" != palm ]]; then NGRAM_IGNORE="."; fi
# UniLM v1 (CNN/DM) and UniLMv2 (CNN/DM, XSum) fine-tune at 768 positions; the released models have 512, grown as
# the authors' s2s-ft does (the pre-trained rows copied again)
[[ "$MODEL" == unilm || "$MODEL" == unilm2 ]] && POSITIONS=${POSITIONS:-768}

# The stories are on Google Drive (https://cs.nyu.edu/~kcho/DMQA/): download cnn_stories.tgz and
# dailymail_stories.tgz there and unpack them into $DOWNLOAD (giving cnn/stories and dailymail/stories).
download() {
  for split in train val test; do
    fetch "https://raw.githubusercontent.com/abisee/cnn-dailymail/master/url_lists/all_$split.txt" \
      "$DOWNLOAD/url_lists/all_$split.txt"
  done
  [[ -d "$DOWNLOAD/cnn/stories" && -d "$DOWNLOAD/dailymail/stories" ]] || die "unpack cnn_stories.tgz and \
dailymail_stories.tgz (https://cs.nyu.edu/~kcho/DMQA/) into $DOWNLOAD"
}

convert() {
  local split url_list
  for split in train valid test; do
    url_list=$([[ $split == valid ]] && echo val || echo "$split")
    "$BIN/palm-prepare" cnndm --stories-dir "$DOWNLOAD/cnn/stories" --stories-dir "$DOWNLOAD/dailymail/stories" \
      --url-list "$DOWNLOAD/url_lists/all_$url_list.txt" --out "$WORK/raw/$split"
  done
}

main "$@"
