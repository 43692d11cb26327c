# Issue 41, the gpu preset's other rows at 3 seeds (docs/paper_tables_gpu_plan.md, "On the card"): about 8 minutes.
# run: carry .whl card/card_data.tgz; timeout_s 600
# Resumes from the committed runs of results/gpu; brings back each run's result.json and log.txt (commit them, then
# `palm-experiments ... --report-only` writes the tables here).
source card/common.sh
install_wheels
unpack card/card_data.tgz
tool 540 palm_tools.experiments.cli --preset gpu --device cuda --jobs 14 \
    --work results/gpu --out results/gpu/paper_tables_gpu --scale data=card_data seeds=1,2,3
[ -n "${CARD_PLAN:-}" ] || tar czf "$OUT/gpu.tgz" results/gpu/scale.json results/gpu/runs/*/result.json \
    results/gpu/runs/*/log.txt results/gpu/paper_tables_gpu.*
