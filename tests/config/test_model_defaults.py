from __future__ import annotations

from gpu_share.config.model import DEFAULT_FATAL_XIDS, DEFAULT_IGNORED_XIDS, HealthConfig


def test_fatal_and_ignored_xids_do_not_overlap() -> None:
    assert not set(DEFAULT_FATAL_XIDS) & set(DEFAULT_IGNORED_XIDS)
    cfg = HealthConfig.model_validate({"fatalXids": [79]})
    assert cfg.fatal_xids == [79]
