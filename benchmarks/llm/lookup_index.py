"""Prompt lookup's search, per round, by context length: the backward scan over the whole
sequence against the per-sequence token index the engine keeps (``TokenIndex``).

    python benchmarks/llm/lookup_index.py [--output lookup_index.json]

A document of N random tokens (vocabulary 2,048, and a text-like 300), then 20 more, then
a 3-token suffix that occurs near the document's start: the match is far back, as when
the text being written copies a long prompt. Microseconds per lookup, the mean of 200.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import timeit
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from native_kernels import machine  # noqa: E402

from turboinfer.llm.engine.speculative import NgramProposer, TokenIndex  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=HERE / "lookup_index.json")
    args = parser.parse_args()
    proposer = NgramProposer(3, 8)
    gen = random.Random(1)
    rows = []
    for vocab in (2048, 300):
        for n in (150, 2000, 8000):
            doc = [gen.randrange(vocab) for _ in range(n)]
            tokens = doc + [gen.randrange(vocab) for _ in range(20)] + doc[10:13]
            index = TokenIndex().update(tokens)
            assert proposer._lookup(tokens, 8, index) == proposer._lookup(tokens, 8)
            scan = timeit.timeit(lambda t=tokens: proposer._lookup(t, 8), number=200) / 200
            indexed = timeit.timeit(lambda t=tokens, i=index: proposer._lookup(t, 8, i.update(t)),
                                    number=200) / 200
            rows.append({"vocab": vocab, "context": len(tokens), "scan_us": 1e6 * scan,
                         "index_us": 1e6 * indexed})
            print(f"vocab {vocab:5d}, context {len(tokens):5d}: scan {1e6 * scan:6.1f} us, "
                  f"index {1e6 * indexed:5.1f} us")
    args.output.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
