# Issue 41, the real-weights experiment (docs/real_weights.md, "On a card"), first of two calls: installs and
# unpacks; card/call_real_seed.sh must follow at once (a machine goes back 30 s after a call).
# run: carry .whl card/real.tgz; timeout_s 120
source card/common.sh
install_wheels
unpack card/real.tgz
[ -n "${CARD_PLAN:-}" ] || {
    printf '#!/bin/sh\nexec python3 -m palm_tools.convert.cli "$@"\n' > /tmp/site/bin/palm-convert
    chmod +x /tmp/site/bin/palm-convert
}
