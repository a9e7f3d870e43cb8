from turbo_dllm.cli import main
from turbo_dllm.train.entry import run_and_end

run_and_end(main)
