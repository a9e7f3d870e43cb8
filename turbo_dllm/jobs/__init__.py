"""Jobs: compile a RunSpec into a JobPlan and a run manifest, then start it.

- `options`: what the command line adds (nodes, processes, rendezvous, restarts, backend)
- `compiler`: RunSpec + options + host -> `plan.JobPlan`
- `manifest`: the run manifest format (`turbo_dllm.run_manifest.v1`), atomic writes
- `provenance`: packages, code version, bundle and data probes for the manifest
- `drift`: field-by-field comparison of a recorded manifest with the present
- `launcher`: prepare / check / materialize / start, used by `dllm launch`
- `backends`: local (in-process), torchrun, SLURM (sbatch script, submission, job states)
- `result`: `result.json`, how a run ended
- `runs`, `plot`: `dllm run list | show | diff | plot`
"""
