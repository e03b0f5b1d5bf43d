"""Each serving engine's settings for one measured run, one module per engine: common.py reads the run's
configuration as the engines take it and holds what their tabs share (the draft an engine loads, a command's
formatting, the notes several engines add); vllm.py, sglang.py, llama_cpp.py and transformers.py each turn it into
that engine's tab (a command or a Python snippet to paste, and its notes), each naming the engine's files and commits
its mapping was checked against. storage/serving/engine_settings.py assembles the four tabs (deploy_settings) and says
which runs can be deployed."""
