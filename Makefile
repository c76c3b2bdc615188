# Two commands (see README): `make demo` and `make test`. Both create and reuse .venv.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
export WHEEL_CHECK := import uopc, uopc.nn, uopc.opt, uopc.tensor; assert "/site/uopc/" in uopc.__file__, uopc.__file__; from uopc import Tensor; print("wheel ok:", uopc.__file__, Tensor([1.0, 2.0]).softmax(-1).numpy())

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[test]'
	touch $@

.PHONY: demo test lint wheel-check clean
demo: $(VENV)/.installed
	$(VPY) examples/demo.py
	$(VPY) examples/train_mnist.py

test: $(VENV)/.installed
	$(VPY) -m pytest tests -q
	# once more with the optimizer off and every load and store index checked against its buffer
	UOPC_CHECK_OOB=1 OPT=0 $(VPY) -m pytest tests -q
	# and the autotuner (OPT=2) on the reductions and matmuls of the Tensor suite
	OPT=2 $(VPY) -m pytest tests/backend/test_tensor_ops.py -q -k "matmul or softmax or sum or mean or var or max"
	$(MAKE) --no-print-directory wheel-check lint

# build the wheel and import uopc from it alone (not from this checkout): every subpackage must ship
wheel-check: $(VENV)/.installed
	@d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	$(VPY) -m pip wheel -q --no-deps -w "$$d/dist" . && \
	$(VPY) -m pip install -q --no-deps --target "$$d/site" "$$d"/dist/uopc-*.whl && \
	cd "$$d" && PYTHONPATH="$$d/site" $(abspath $(VPY)) -c "$$WHEEL_CHECK"

lint: $(VENV)/.installed
	$(VPY) -m ruff check uopc tests examples bench
	$(VPY) -m ruff format --check uopc tests examples bench

clean:
	rm -rf $(VENV) *.egg-info
