import logging
import os
import sys

from turbo_dllm.cli import main

code = main()
if "TORCHELASTIC_RUN_ID" in os.environ:
    # A torchrun worker whose work is done, saved and closed ends without the interpreter's
    # finalization: there gloo's threads aborted one rank of about one in ten two-rank CPU runs
    # ("terminate called without an active exception"), failing a run that had finished.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
raise SystemExit(code)
