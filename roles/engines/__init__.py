"""The engines' room: one package per engine (kt/, vllm/), what both share (common.py,
flag_check.py), and the dispatch with the contract each engine keeps (dispatch.py). Empty on
purpose: an engine imports common.py through this package, so the package imports no engine."""
