"""RunSpec (typed run configuration), its validation, loading and packaged recipes."""

from turbo_dllm.config.load import load_runspec
from turbo_dllm.config.runspec import RunSpec

__all__ = ["RunSpec", "load_runspec"]
