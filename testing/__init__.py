"""What the tests and the benchmarks share: server processes, toy models and Flows."""
