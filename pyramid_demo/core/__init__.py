"""The decoding core: settings, acceptance rules, the engine loop, trace records, statistics (knows only forwards)."""
