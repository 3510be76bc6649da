"""Run by test_offline.py in a fresh interpreter: the offline ``sglang.Engine`` with sglang-fl.

argv: MODEL_PATH MAX_NEW_TOKENS PROMPT_IDS_JSON. Prints one ``RESULT {...}`` line with the greedy
output ids. A fresh process, because the Engine spawns its scheduler and owns global state.
"""

import json
import sys


def main() -> None:
    import sglang

    model, max_new, prompts = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    engine = sglang.Engine(model_path=model, dtype="float32", log_level="warning")
    try:
        out = engine.generate(input_ids=prompts, sampling_params={
            "temperature": 0, "max_new_tokens": max_new, "ignore_eos": True})
        print("RESULT " + json.dumps([o["output_ids"] for o in out]), flush=True)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
