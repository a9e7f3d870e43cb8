"""Data preparation: sources -> records -> tokens -> packed, verifiable artifacts -> loader.

`dllm data prepare` reads a `prepare.yaml` (`turbo_dllm.data.spec`), streams raw records from a
source (`sources`), turns each into a token document with a loss mask (`records`, `tokenizers`,
`pipeline`, in a process pool with deterministic order), packs documents into fixed-length
sequences (`packing`) and writes a content-fingerprinted artifact folder (`artifact`). The
trainer streams it back through `loader.ArtifactLoader`.

Importing this package is cheap: heavy libraries (datasets, transformers, torch) load only in the
functions that need them.
"""

__all__: list[str] = []
