# Sourced by each card call (card/README.md). On the card it installs the wheels a call carries in `.whl` and runs
# the tools within their timeouts. With CARD_PLAN=1, here and without a GPU, it installs nothing and each tool prints
# its plan (--plan-only) or, for the CUDA tests, the tests a group selects: how a call is checked before a card is lent.
set -euo pipefail
shopt -s nullglob  # an archive of what a call brings back leaves out what a run cut short did not write
OUT=${OUT:-/tmp/card-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH

# install_wheels: fairseq and what it needs that the card lacks, from the wheels the call carries (card/prepare.sh)
install_wheels() {
    [ -n "${CARD_PLAN:-}" ] && return
    [ -d .whl ] || { echo "card: no .whl here: carry it (run: carry [\".whl\", ...])"; exit 3; }
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
}

# tool SECONDS MODULE ARGUMENTS...: `python3 -m MODULE ARGUMENTS` stopped after SECONDS (a run cut short keeps what it
# finished; the next call resumes)
tool() {
    local seconds=$1
    shift
    if [ -n "${CARD_PLAN:-}" ]; then
        python3 -m "$@" --plan-only
    else
        timeout "$seconds" python3 -m "$@" || echo "card: python3 -m $1 ended with status $? (124: its timeout)"
    fi
}

# cuda_tests SECONDS EXPRESSION...: each -k EXPRESSION of tests/test_gpu.py in a process of its own (a CUDA error
# fails every later test of its process), the failures' lines kept short enough for a call's output
cuda_tests() {
    local seconds=$1 group
    shift
    for group in "$@"; do
        echo "card: tests/test_gpu.py -k \"$group\""
        if [ -n "${CARD_PLAN:-}" ]; then
            python3 -m pytest -q -p no:cacheprovider --collect-only tests/test_gpu.py -k "$group" | grep "::" || {
                echo "card: -k \"$group\" selects no test of tests/test_gpu.py"; return 1; }
        else
            timeout "$seconds" python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "$group" --tb=short -rfE \
                2>&1 | grep -E "^(FAILED|ERROR)|^E |passed|failed" | cut -c1-300 | head -12 || true
        fi
    done
}

# unpack ARCHIVE: what a call carries packed (a plan only checks that it would be there)
unpack() {
    if [ -n "${CARD_PLAN:-}" ]; then
        echo "card: would unpack $1"
    else
        [ -f "$1" ] || { echo "card: no $1 here: carry it (make card builds it)"; exit 3; }
        tar xzf "$1"
    fi
}
