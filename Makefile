# Shortcuts; each line is the command the README and docs/testing.md name.
DATA ?= $(or $(LOOPTUNE_DATA),../shared/data/mnist)
PY ?= python

.PHONY: test bench vision mutation

test:            ## the test command CI runs (.ci/run)
	$(PY) -m pytest

bench:           ## every benchmark's full goal on this machine; fails if one is not met
	$(PY) benchmarks/run_goals.py --data $(DATA) --json benchmarks/results/goals-$$(date +%F).json \
	  --logs benchmarks/results/logs-$$(date +%F)

vision:          ## the second CI job: looptune's image code against torchvision's
	bash .ci/vision

# the functions that decide a verdict, a remedy's rank or a tuner's / the engine's choice
MUTANTS = \
  'looptune.diagnose.rules.overhead.x_compute_or_overhead*' 'looptune.diagnose.verdict.x__timing_bottleneck*' \
  'looptune.diagnose.rules.overhead.x__by_shares*' 'looptune.diagnose.verdict.x__rank_key*' \
  'looptune.diagnose.rules.profile.x_amdahl_remedy*' 'looptune.diagnose.rules.profile.x_amdahl*' \
  'looptune.diagnose.rules.profile.x_largest_phase*' 'looptune.diagnose.verdict.x__remedies_*' \
  'looptune.diagnose.rules.batch.x_batch_verdict*' 'looptune.diagnose.rules.batch.x_batch_remedy*' \
  'looptune.diagnose.rules.batch.x_scaled_step*' \
  'looptune.diagnose.rules.compute.x_cpu_compute_remedies*' 'looptune.diagnose.rules.compute.x__bounded*' \
  'looptune.diagnose.rules.update.x__impl_remedy*' 'looptune.diagnose.rules.update.x__zero_grad_remedy*' \
  'looptune.diagnose.verify.x_apply_measured*' \
  'looptune.tune.loader.x__search_workers*' 'looptune.tune.loader.x__compare*' 'looptune.tune.loader.x__gain*' \
  'looptune.tune.batch.x_pick_knee*' 'looptune.tune.batch.x__sweep*' 'looptune.tune.batch.x__refine_sizes*' \
  'looptune.tune.batch.x__eligible*' \
  'looptune.fastpath.threads.xǁThreadGovernorǁcalibrate*' 'looptune.fastpath.threads.xǁThreadGovernorǁ_explored*' \
  'looptune.fastpath.threads.xǁThreadGovernorǁ_window_done*' \
  'looptune.fastpath.mlp_precision.x_choose_bf16*' 'looptune.presets.probe.x_probe_*'

mutation:        ## the mutation check of the deciding functions (docs/testing.md); `pip install -e '.[mutation]'`
	# one OpenMP thread: mutmut forks a process whose torch holds a thread pool (forked, it deadlocks)
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PY) -m mutmut run $(MUTANTS); $(PY) tools/mutation_report.py --json mutants/report.json
