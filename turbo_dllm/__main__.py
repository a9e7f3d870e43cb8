from turbo_dllm.cli import main

raise SystemExit(main())
