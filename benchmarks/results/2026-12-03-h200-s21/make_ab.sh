# The A/B inputs of call_all.sh, from git (run from the repository root before a device call;
# ab/ then travels with the working tree as untracked files): main's op, trainer and batch class
# at afd5e83 (`*_head.py`) and the op with the delta-late change, 8b561e0 (`op_new.py`).
set -eu
R=benchmarks/results/2026-12-03-h200-s21/ab
OP=native/block_diffusion_attention/block_diffusion_attention.py
mkdir -p $R
git show afd5e83:$OP > $R/op_head.py
git show 8b561e0:$OP > $R/op_new.py
git show afd5e83:turbo_dllm/train/trainer.py > $R/trainer_head.py
git show afd5e83:turbo_dllm/train/objectives/base.py > $R/base_head.py
