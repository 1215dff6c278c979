"""The decoding core: settings, pure acceptance rules, the engine loop, cached models, trace records, statistics
and the throughput model. Imports nothing else of the project."""
