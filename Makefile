# Two commands (see README): `make demo` and `make test`. Both create and reuse .venv.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
# the ISA-sensitive tests, run once more for an AVX2-only x86-64 (x86-64-v3) on whatever machine runs make test
ISA_TESTS := tests/backend/test_vectorize.py tests/backend/test_gemm.py tests/backend/test_transcendental.py \
	tests/backend/test_half.py tests/unit/test_machine.py tests/backend/test_torch_sweep.py \
	tests/backend/test_attention.py::test_fused_attention_matches_torch_forward_and_backward \
	tests/backend/test_conv.py::test_a_depthwise_convolution_is_a_direct_loop_at_stride_1
export V3_CFLAGS := from uopc.runtime.compiler import _DEFAULT_CFLAGS as f; print(" ".join(x.replace("=native", "=x86-64-v3") for x in f))
export WHEEL_CHECK := import uopc, uopc.nn, uopc.opt, uopc.tensor; assert "/site/uopc/" in uopc.__file__, uopc.__file__; from uopc import Tensor; print("wheel ok:", uopc.__file__, Tensor([1.0, 2.0]).softmax(-1).numpy())

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[test]'
	touch $@

.PHONY: demo test test-v3 lint wheel-check clean
demo: $(VENV)/.installed
	$(VPY) examples/demo.py
	$(VPY) examples/train_mnist.py

# pytest-xdist: one test process per CPU (a test spends most of its time in Python and gcc, one core each), each
# taking whole files (--dist loadfile): a file's tests share their process's plan cache and module fixtures. Measured
# on 2 cores against the per-test split: the torch sweep's fixture (every case built and compiled, ~150 s) runs once
# per pass, not once in each process, and ONNX conformance's 1800 cases take 310 CPU s instead of 490
XDIST := -n auto --dist loadfile

test: $(VENV)/.installed
	$(VPY) -m pytest tests -q $(XDIST)
	# once more with the optimizer off and every load and store index checked against its buffer (not the tests that
	# would run as in the first pass or compile no kernel form the others do not: tests/conftest.py's SINGLE_PASS)
	UOPC_CHECK_OOB=1 OPT=0 $(VPY) -m pytest tests -q $(XDIST) -m "not single_pass"
	# and the autotuner (OPT=2) on the reductions and matmuls of the Tensor suite (one file: split by test)
	OPT=2 $(VPY) -m pytest tests/backend/test_tensor_ops.py -q -n auto -k "matmul or softmax or sum or mean or var or max"
	$(MAKE) --no-print-directory test-v3 wheel-check lint

# -march in CFLAGS decides the ISA uopc targets (the Machine record), so an AVX-512 machine runs the AVX2 paths here;
# the sweep runs its float16 and bfloat16 cases only
test-v3: $(VENV)/.installed
	@if [ "$$(uname -m)" != x86_64 ]; then echo "x86-64-v3 pass: not an x86-64 machine, skipped"; exit 0; fi; \
	start=$$(date +%s); \
	CFLAGS="$$($(VPY) -c "$$V3_CFLAGS")" $(VPY) -m pytest $(ISA_TESTS) -q $(XDIST) --sweep-dtypes=f16,bf16 && \
	echo "x86-64-v3 pass: $$(( $$(date +%s) - start )) s"

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
