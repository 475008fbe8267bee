.PHONY: test demo lint fmt generate image chart-lint bench cluster-up cluster-down

# README "Test": static checks + every test level this machine can run.
test:
	bash hack/test.sh

# README "Demo": local cluster + gpu-share on the dummy backend + a few pods.
demo:
	bash hack/demo.sh

lint:
	bash -c '. hack/lib/venv.sh && ensure_venv && ruff check src tests hack bench testkit && mypy src/gpu_share && lint-imports && shell_lint && python hack/module-size.py'

# Apply ruff's automatic fixes (import order and the like) to what `lint` checks.
fmt:
	bash -c '. hack/lib/venv.sh && ensure_venv && ruff check --fix src tests hack bench testkit'

# Regenerate what is generated from a source in the tree: the gRPC stubs (proto/), the
# chart's values.schema.json and README (values.yaml, the agent's config model).
generate:
	bash -c '. hack/lib/venv.sh && ensure_venv && bash hack/gen-proto.sh && python hack/chart-schema.py && python hack/chart-readme.py'

# The gpu-share image (the agent, extender, webhook and CLI), imported into the local cluster's containerd.
image:
	bash hack/build-image.sh

# helm lint of the chart with helm 3 and helm 4 (fetched into the cache by hack/install-tools.sh).
chart-lint:
	bash -c 'set -e; for h in $$(bash hack/install-tools.sh | cut -d= -f2); do "$$h" lint --strict charts/gpu-share; done'

cluster-up:
	bash hack/local-up-cluster.sh up

cluster-down:
	bash hack/local-up-cluster.sh down

# Issue #7: gpu-share vs the Go sample device plugin on the local kubelet (docs/performance.md).
bench:
	bash bench/run-agent-bench.sh
