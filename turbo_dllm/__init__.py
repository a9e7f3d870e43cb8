"""Turbo-dLLM: block-diffusion language model training with reproducible environments."""

__all__ = ["__version__"]

__version__ = "0.1.0"
