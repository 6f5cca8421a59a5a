"""Schedulers above the engine: FedAST's asynchronous multi-task scheduler, Sync-ST's
synchronous rounds of several tasks, buffered servers, jobs mode and its scatter to worker
processes. They drive the engine on the clock that ``fedforge.sim`` keeps."""
