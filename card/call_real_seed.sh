# Issue 41, the real-weights experiment, second call: `bash card/call_real_seed.sh N` runs seed N (1, 2, 3: one a
# call, about 6.5 minutes) of MiniLM continued for 3,000 updates, right after card/call_real_install.sh on the same
# machine.
# run: carry card/minilm; timeout_s 600
SEED=${1:?"usage: bash card/call_real_seed.sh SEED (1, 2 or 3)"}
source card/common.sh
[ -n "${CARD_PLAN:-}" ] || [ -x /tmp/site/bin/palm-convert ] || {
    echo "card: a fresh machine: run card/call_real_install.sh again, then this call at once"; exit 3; }
tool 540 palm_tools.experiments.cli --only real --rows real/v2_ae_par real/v2_ae real/v2_ckpt real/mix \
    real/bidir real/ckpt --device cuda --jobs 10 --scale corpus=all real_pretrain_updates=3000 data=card_data \
    minilm=card/minilm seeds="$SEED" --work results/real_gpu --out results/real_gpu/paper_tables_real_gpu
[ -n "${CARD_PLAN:-}" ] || tar czf "$OUT/real.tgz" results/real_gpu/runs/*/result.json \
    results/real_gpu/runs/*/log.txt results/real_gpu/paper_tables_real_gpu.*
