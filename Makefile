.PHONY: test demo lint bench cluster-up cluster-down

# README "Test": static checks + every test level this machine can run.
test:
	bash hack/test.sh

# README "Demo": local cluster + gpu-share on the dummy backend + a few pods.
demo:
	bash hack/demo.sh

lint:
	bash -c '. hack/lib/venv.sh && ensure_venv && ruff check src tests hack bench && mypy src/gpu_share && lint-imports && shell_lint'

cluster-up:
	bash hack/local-up-cluster.sh up

cluster-down:
	bash hack/local-up-cluster.sh down

# Issue #7: gpu-share vs the Go sample device plugin on the local kubelet (docs/performance.md).
bench:
	bash bench/run-agent-bench.sh
