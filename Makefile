# Two entry points matter (README.md): `make run` and `make test`.
# Both create the virtualenv on first use, so they work on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two installs: `make run` needs what a broker needs (pyproject.toml's dependencies, about
# 150 MB); the tests, lints and benchmarks add the dev extras (pyspark with its JVM jars,
# moto, ruff, mypy, ...: over 1 GB), installed the first time one of them runs.
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed-dev

.PHONY: run test check bench jepsen jepsen-power jepsen-campaign clean system-deps bytecode

$(RUN_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Debian packages the tests use (curl for the README examples, nats-server for the
# NATS comparison benchmark and its smoke test, iptables for the jepsen/ partitions, a
# Java 17 runtime for the Spark tests of spark_io/, chromium and its WebDriver for the web
# console's browser tests, libfaketime for the stepped-clock test and jepsen/'s clock
# nemesis, strace for jepsen/'s crash-point explorer). Installed only if missing.
system-deps:
	@command -v curl >/dev/null 2>&1 && command -v nats-server >/dev/null 2>&1 && \
		command -v iptables >/dev/null 2>&1 && command -v java >/dev/null 2>&1 && \
		command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 && \
		command -v faketime >/dev/null 2>&1 && command -v strace >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq curl nats-server iptables \
			openjdk-17-jre-headless chromium chromium-driver faketime strace; }

# The targets that start many Python processes (brokers, harness clients) compile the
# sources first: where PYTHONDONTWRITEBYTECODE is set, no process writes the .pyc it
# compiled, and each would compile ~160 modules again (0.8 s of CPU a broker). `make test`
# does the same in tests/conftest.py.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q dmq raft log groups http_api spark_io bench jepsen >/dev/null

run: $(RUN_STAMP)
	$(BIN)/dmq serve

# One pytest worker per core (at most 4), whole files to a worker (`loadfile`: a module's
# fixtures and its tests' order stay as written). The tests' brokers pick free ports and
# the jepsen/ chains are per process and port, so two files never see each other's
# faults. `python -m pytest tests/x` alone stays serial.
test: $(STAMP) system-deps
	$(BIN)/ruff check .
	$(BIN)/python -m pytest --numprocesses auto --maxprocesses 4 --dist loadfile

# `ruff check .` runs flake8-bandit's rules ("S") everywhere; on http_api/ and
# dmq/broker/security.py all of them, S101 (assert) included (pyproject.toml). The second
# line proves that: it selects every S rule, preview ones too, ignores nothing, on them.
SECURITY_PATHS := http_api dmq/broker/security.py
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff check --select S --preview --config 'lint.ignore = []' $(SECURITY_PATHS)
	$(BIN)/mypy

bench: $(STAMP) system-deps bytecode
	$(BIN)/dmq bench log
	$(BIN)/dmq bench broker
	$(BIN)/dmq bench --nodes 3
	$(BIN)/dmq bench spark
	$(BIN)/python -m bench.compare_nats

# The Jepsen harness (jepsen/README.md): 5 brokers, every fault, 2 minutes. Override with
# e.g. `make jepsen JEPSEN_ARGS="--nodes 3 --nemesis partition --seed 7"`.
JEPSEN_ARGS ?= --nodes 5 --nemesis partition,kill,pause,power,reassign,join,leave,voters --time-limit-s 120
jepsen: $(STAMP) system-deps bytecode
	$(BIN)/python -m jepsen.run $(JEPSEN_ARGS)

# Detection power (jepsen/README.md "Detection power"): every planted bug and the correct
# build on seeds 1..SEEDS, 3 nodes, partition,kill,pause,power, 45 s each, one at a time.
SEEDS ?= 10
jepsen-power: $(STAMP) system-deps bytecode
	$(BIN)/python -m jepsen.power --bug all --seeds $(SEEDS)

# N runs of the correct build on random seeds: 5 nodes, every fault (disk and clock too:
# Debian's libfaketime, installed if missing), 60 s each, one at a time, then a summary
# table. CAMPAIGN_ARGS adds options (e.g. --campaign-seed 7 draws the same seeds again).
N ?= 10
CAMPAIGN_ARGS ?=
jepsen-campaign: $(STAMP) system-deps bytecode
	@command -v faketime >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq faketime; }
	$(BIN)/python -m jepsen.campaign --runs $(N) $(CAMPAIGN_ARGS)

clean:
	rm -rf $(VENV) dmq-data .pytest_cache .hypothesis
