"""gpu_share.observability: Prometheus metrics, the probe/metrics endpoint, logging."""

from gpu_share.observability.http import Heartbeat, HttpHandle, start_http
from gpu_share.observability.logging import configure_logging
from gpu_share.observability.metrics import Metrics

__all__ = ["Heartbeat", "HttpHandle", "Metrics", "configure_logging", "start_http"]
