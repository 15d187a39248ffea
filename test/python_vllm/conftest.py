import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_support  # noqa: E402,F401  (sets the vLLM environment before any import of vllm)
