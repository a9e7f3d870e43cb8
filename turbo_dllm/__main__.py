from turbo_dllm.cli import main
from turbo_dllm.train.entry import end_process

end_process(main())
