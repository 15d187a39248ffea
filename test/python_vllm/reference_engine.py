"""A fresh engine per checkpoint (the reference of test_engine.py): for each
checkpoint directory, start vLLM from it and write every worker's state and
the greedy output to OUT/<basename>.pt.

    python reference_engine.py OUT DTYPE TP CKPT...
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_support as es  # noqa: E402

import pickle  # noqa: E402


def main() -> None:
    out, dtype, tp, ckpts = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    for ck in ckpts:
        llm = es.start_engine(ck, dtype, tp=tp)
        rec = {"state": es.engine_state(llm), "tokens": es.greedy(llm)}
        dst = os.path.join(out, os.path.basename(ck.rstrip("/")) + ".pt")
        with open(dst + ".tmp", "wb") as f:
            pickle.dump(rec, f)
        os.replace(dst + ".tmp", dst)
        es.shutdown(llm)


if __name__ == "__main__":
    main()
