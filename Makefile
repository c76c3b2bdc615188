# Two commands (see README): `make demo` and `make test`. Both create and reuse .venv.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[test]'
	touch $@

.PHONY: demo test lint clean
demo: $(VENV)/.installed
	$(VPY) examples/demo.py
	$(VPY) examples/train_mnist.py

test: $(VENV)/.installed
	$(VPY) -m pytest tests -q
	# once more with the optimizer off and every load and store index checked against its buffer
	UOPC_CHECK_OOB=1 OPT=0 $(VPY) -m pytest tests -q
	# and the autotuner (OPT=2) on the reductions and matmuls of the Tensor suite
	OPT=2 $(VPY) -m pytest tests/backend/test_tensor_ops.py -q -k "matmul or softmax or sum or mean or var or max"

lint: $(VENV)/.installed
	$(VPY) -m ruff check uopc tests examples bench

clean:
	rm -rf $(VENV) *.egg-info
