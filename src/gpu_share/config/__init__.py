"""gpu_share.config: the AgentConfig model and how it is loaded."""

from gpu_share.config.loader import (
    InvalidConfigError,
    Problem,
    add_config_arguments,
    build_arg_parser,
    config_from_namespace,
    dump_config,
    format_problems,
    load_config,
    read_config_file,
    validate_config,
)
from gpu_share.config.model import AgentConfig

__all__ = [
    "AgentConfig",
    "InvalidConfigError",
    "Problem",
    "add_config_arguments",
    "build_arg_parser",
    "config_from_namespace",
    "dump_config",
    "format_problems",
    "load_config",
    "read_config_file",
    "validate_config",
]
