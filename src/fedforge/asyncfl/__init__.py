"""Asynchronous and multi-task federated training on the simulated clock (FedAST and baselines)."""
