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

mutation:        ## the mutation check of the decision modules (docs/testing.md)
	$(PY) -m mutmut run && $(PY) -m mutmut results
