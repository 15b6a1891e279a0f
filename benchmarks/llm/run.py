"""LLM engine benchmarks: continuous-batching throughput and paged-KV use (transformers
``generate()`` at batch 1 as the baseline), speculative decoding with the demo draft,
weight-only quantization speed and perplexity. The side-by-side comparison with
CTranslate2 and llama.cpp is ``compare.py``.

    python benchmarks/llm/run.py [--sections throughput,speculative,quant] [--gen-len 64]

Writes ``benchmarks/llm/results.json`` (or ``--output``, merged into what is there) and
prints the tables README.md quotes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from turboinfer.hardware.cpu import read_cpu
from turboinfer.llm import LLM, EngineConfig, SamplingParams, demo_model_dir
from turboinfer.llm.bench import BenchSettings, run_bench
from turboinfer.llm.engine.speculative import SpecStats
from turboinfer.llm.model.config import QuantMode
from turboinfer.llm.model.loader import load_model
from turboinfer.llm.model.quant import quantize_model
from turboinfer.llm.perplexity import perplexity
from turboinfer.llm.tokenizer import Tokenizer

HERE = Path(__file__).resolve().parent
WORK = Path("/tmp/turboinfer-llm-bench")
SHAPE_110M = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                  num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=12,
                  max_position_embeddings=1024, tie_word_embeddings=True)


def build_110m(folder: Path) -> Path:
    """A random Llama-shaped ~110M model in HF format, with a word tokenizer."""
    import transformers
    from tokenizers import Tokenizer as HFTok
    from tokenizers import models, pre_tokenizers

    if (folder / "model.safetensors").is_file():
        return folder
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**SHAPE_110M, bos_token_id=1, eos_token_id=2)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    vocab = {f"t{i}": i for i in range(SHAPE_110M["vocab_size"])}
    tok = HFTok(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1",
                                         eos_token="t2").save_pretrained(folder)
    return folder


def prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(n)
    return torch.randint(3, vocab, (n, length), generator=g).tolist()


def hf_generate_tps(folder: Path, prompt_len: int, gen_len: int) -> tuple[float, float]:
    """(output tokens per wall second, per CPU second) of ``generate()`` at batch 1."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.tensor(prompts(1, prompt_len, SHAPE_110M["vocab_size"]))
    kwargs = dict(max_new_tokens=gen_len, min_new_tokens=gen_len, do_sample=False,
                  pad_token_id=0)
    with torch.inference_mode():
        model.generate(ids, **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})
        start, cpu = time.perf_counter(), time.process_time()
        out = model.generate(ids, **kwargs)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    n = out.shape[1] - prompt_len
    return n / seconds, n / cpu


def throughput(args: argparse.Namespace) -> dict[str, object]:
    folder = build_110m(WORK / "llama-110m")
    p, g = args.prompt_len, args.gen_len
    hf_wall, hf_cpu = hf_generate_tps(folder, p, g)
    res: dict[str, object] = {"hf_generate_batch1_tps": hf_wall,
                              "hf_generate_batch1_tps_cpu": hf_cpu}
    llm = LLM(folder, config=EngineConfig(kv_cache_tokens=16 * (8 * p + 2 * g) + 256))
    rows = run_bench(llm.engine, BenchSettings(concurrency=(1, 4, 16), prompt_len=p,
                                               gen_len=g))
    res["turboinfer"] = [r.to_dict() for r in rows]
    mixed = run_bench(llm.engine, BenchSettings(concurrency=(16,), prompt_len=8 * p,
                                                gen_len=2 * g, mixed=True))
    res["turboinfer_mixed_lengths"] = [r.to_dict() for r in mixed]
    return res


def single_stream(llm: LLM, prompt: str | list[int],
                  gen_len: int) -> tuple[float, list[int]]:
    """(output tokens per CPU second, the tokens) for one greedy request."""
    cpu, _, tokens = timed(llm, prompt, gen_len)
    return len(tokens) / cpu, tokens


def timed(llm: LLM, prompt: str | list[int], gen_len: int) -> tuple[float, float, list[int]]:
    """(CPU seconds, wall seconds, the tokens) of one greedy request."""
    params = SamplingParams(max_tokens=gen_len, temperature=0, ignore_eos=True)
    cpu, wall = time.process_time(), time.perf_counter()
    out = llm.generate(prompt, params)[0]
    return time.process_time() - cpu, time.perf_counter() - wall, list(out.token_ids)


def warm(llm: LLM) -> LLM:
    llm.generate(DEMO_PROMPTS[0], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    return llm


DEMO_PROMPTS = ["Return a new list containing", "The default value of the timeout",
                "If the file does not exist,"]


def regenerate_prompts(llm: LLM, count: int, gen_len: int) -> list[list[int]]:
    """The repetitive workload: the prompt holds an earlier answer and asks again.

    For the first line X of each of ``count`` held-out docstrings, the model's greedy
    answer Y is generated, and the prompt is ``X Y "\n\n" X``: the text the model is
    about to write is (mostly) already in its context, as in code editing, where the
    file being edited is in the prompt. The demo model does not copy text it did not
    write (given a held-out passage and its beginning again, it continues differently),
    so the earlier text is its own; attending to it, it does not repeat it exactly either.
    """
    text = (demo_model_dir().parent / "heldout.txt").read_text()
    firsts = [doc.strip().split("\n")[0] for doc in text.split("<|endoftext|>")]
    firsts = [line for line in firsts if 4 <= len(line.split()) <= 12][:count]
    tok = llm.tokenizer
    out = []
    for line in firsts:
        x = tok.encode(line)
        _, _, y = timed(llm, x, gen_len)
        out.append(x + y + tok.encode("\n\n") + x)
    return out


def found_in_prompt(prompt: list[int], output: list[int], n: int = 4) -> float:
    """Share of output tokens that, with the n - 1 tokens before them, occur in the
    prompt: the part of the output a lookup in the prompt could have proposed."""
    grams = {tuple(prompt[i:i + n]) for i in range(len(prompt) - n + 1)}
    full = prompt + output
    hits = sum(tuple(full[i - n + 1:i + 1]) in grams for i in range(len(prompt), len(full)))
    return hits / len(output)


def speculative(args: argparse.Namespace) -> dict[str, object]:
    """Plain and speculative decoding of the same prompts, interleaved prompt by prompt
    and round by round so both see the same machine; a round runs every prompt
    ``--spec-repeats`` times on each engine, and the speed-up is the median of the
    per-round ratios, per CPU second and per wall second.

    ``draft`` (the demo draft) and ``ngram`` (prompt lookup) run on the demo prompts and
    on the repetitive workload (``regenerate_prompts``); with ``--model`` another model
    takes the demo's place, prompt lookup only (the demo draft speaks the demo's
    vocabulary), its repetitive workload built from its own answers."""
    # The thread count asked for (else the engine would pick one by measurement).
    q = args.spec_quant   # the target's weights, alike in every engine compared
    plain = warm(LLM(args.model, quant=q, config=EngineConfig(num_threads=args.threads)))
    variants = {"ngram": warm(LLM(args.model, ngram=args.ngram, quant=q, config=EngineConfig(
        num_speculative_tokens=args.ngram_k, num_threads=args.threads)))}
    if args.model is None:      # the demo draft speaks the demo model's vocabulary
        variants = {"draft": warm(LLM(draft=demo_model_dir("draft"), quant=q,
                                      config=EngineConfig(num_speculative_tokens=args.k,
                                                          num_threads=args.threads))),
                    **variants}
    if args.compare_fixed and args.model is None:
        # Beside the engine's measured choice: the demo draft proposing k every round and
        # prompt lookup verifying whatever its match asks for.
        variants["draft_fixed"] = warm(LLM(
            draft=demo_model_dir("draft"), quant=q, config=EngineConfig(
                num_speculative_tokens=args.k, num_threads=args.threads,
                adapt_speculative_tokens=False)))
        variants["ngram_fixed"] = warm(LLM(ngram=args.ngram, quant=q, config=EngineConfig(
            num_speculative_tokens=args.ngram_k, num_threads=args.threads,
            adapt_speculative_tokens=False)))
    workloads: dict[str, list[str | list[int]]] = {
        "demo": list(DEMO_PROMPTS),
        "regenerate": list(regenerate_prompts(plain, args.regenerate_prompts, args.gen_len))}
    res: dict[str, object] = {"quant": plain.config.quant.value}
    for workload, prompts in workloads.items():
        res[workload] = spec_rounds(plain, variants, prompts, args)
    return res


def spec_rounds(plain: LLM, variants: dict[str, LLM], prompts: list[str | list[int]],
                args: argparse.Namespace) -> dict[str, object]:
    names = ["plain", *variants]
    llms = {"plain": plain, **variants}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    wall: dict[str, list[float]] = {n: [] for n in names}
    identical = dict.fromkeys(variants, True)
    found: list[float] = []
    before = {n: dataclasses.replace(v.engine.spec_stats) for n, v in variants.items()}
    tokens = len(prompts) * args.gen_len * args.spec_repeats
    # An untimed pass first: the prefix cache then holds every prompt in every engine
    # alike. Without it the first round charged the speculative engines each long prompt's
    # prefill, which the plain engine, having written the repetitive workload's earlier
    # answers itself, partly had cached (that round ran 1.26-1.49x where the others ran
    # 1.5-1.9x).
    for prompt in prompts:
        for name in names:
            timed(llms[name], prompt, args.gen_len)
    for r in range(args.spec_rounds):
        spent = {n: [0.0, 0.0] for n in names}
        for i, prompt in enumerate(prompts * args.spec_repeats):
            # Rotate who goes first, so no engine always runs right after another.
            order = names[(r + i) % len(names):] + names[:(r + i) % len(names)]
            outs = {}
            for name in order:
                c, w, outs[name] = timed(llms[name], prompt, args.gen_len)
                spent[name][0] += c
                spent[name][1] += w
            for name in variants:
                identical[name] &= outs[name] == outs["plain"]
            if r == 0 and i < len(prompts) and isinstance(prompt, list):
                found.append(found_in_prompt(prompt, outs["plain"]))
        for name in names:
            cpu[name].append(tokens / spent[name][0])
            wall[name].append(tokens / spent[name][1])
    res: dict[str, object] = {"prompts": len(prompts), "gen_len": args.gen_len,
                              "rounds": args.spec_rounds, "repeats": args.spec_repeats,
                              "plain_tps": statistics.median(cpu["plain"]),
                              "plain_tps_wall": statistics.median(wall["plain"])}
    if found:
        res["output_found_in_prompt"] = statistics.mean(found)
    for name, llm in variants.items():
        s, b = llm.engine.spec_stats, before[name]
        stats = SpecStats(s.target_forwards - b.target_forwards, s.drafted - b.drafted,
                          s.accepted - b.accepted, s.emitted - b.emitted)
        ratios = [a / p for a, p in zip(cpu[name], cpu["plain"], strict=True)]
        ratios_wall = [a / p for a, p in zip(wall[name], wall["plain"], strict=True)]
        res[name] = {"spec_tps": statistics.median(cpu[name]),
                     "spec_tps_wall": statistics.median(wall[name]),
                     "speedup": statistics.median(ratios),
                     "speedup_min": min(ratios), "speedup_max": max(ratios),
                     "speedup_rounds": ratios,
                     "speedup_wall": statistics.median(ratios_wall),
                     "speedup_wall_min": min(ratios_wall),
                     "speedup_wall_max": max(ratios_wall),
                     "identical_greedy_output": identical[name],
                     "acceptance_rate": stats.acceptance_rate,
                     "tokens_per_target_forward": stats.tokens_per_forward,
                     "k": llm.config.num_speculative_tokens}
        length = llm.engine.spec_length
        if length is not None:  # the measured costs, and every round so far by its k
            res[name]["speculation"] = length.to_dict()  # type: ignore[index]
    return res


MODES = ("none", "int8", "int4")


def interleaved_tps(llms: dict[str, LLM], prompt: str | list[int], gen_len: int,
                    rounds: int) -> dict[str, float]:
    """Median single-stream tokens per CPU second of each engine, run round by round."""
    seen: dict[str, list[float]] = {name: [] for name in llms}
    for _ in range(rounds):
        for name, llm in llms.items():
            seen[name].append(single_stream(llm, prompt, gen_len)[0])
    return {name: statistics.median(v) for name, v in seen.items()}


def quant(args: argparse.Namespace) -> dict[str, object]:
    res: dict[str, dict[str, object]] = {}
    folder = demo_model_dir()
    tok = Tokenizer.from_folder(folder)
    heldout = tok.encode((folder.parent / "heldout.txt").read_text())[:args.ppl_tokens]
    base_ppl = perplexity(load_model(folder), heldout)
    for mode in MODES:
        model = load_model(folder)
        quantize_model(model, QuantMode(mode), group_size=32)
        ppl = perplexity(model, heldout)
        res[mode] = {"perplexity": ppl, "perplexity_increase_pct": 100 * (ppl / base_ppl - 1)}
    demo = interleaved_tps({m: warm(LLM(quant=m)) for m in MODES}, DEMO_PROMPTS[0],
                           args.gen_len, args.spec_rounds)
    for mode in MODES:
        res[mode]["demo_tps"] = demo[mode]
    if "throughput" in args.sections or (WORK / "llama-110m").exists():
        folder110 = build_110m(WORK / "llama-110m")
        llms = {m: warm(LLM(folder110, quant=m, config=EngineConfig(kv_cache_tokens=1024)))
                for m in MODES}
        big = interleaved_tps(llms, list(range(3, 35)), args.gen_len // 2, 3)
        for mode in MODES:
            res[mode]["110m_tps"] = big[mode]
    return dict(res)


def markdown(results: dict[str, Any]) -> str:
    """The README tables from ``results.json``."""
    lines: list[str] = []
    tp = results.get("throughput")
    if tp:
        lines += ["| system | batch / concurrency | tokens/s (wall) | tokens/s (CPU) | "
                  "TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | KV slots unused |",
                  "|---|---|---|---|---|---|---|",
                  f"| transformers generate() | 1 | {tp['hf_generate_batch1_tps']:.1f} | "
                  f"{tp['hf_generate_batch1_tps_cpu']:.1f} | - | - | - |"]
        rows = [(r, str(r["concurrency"])) for r in tp["turboinfer"]]
        rows += [(r, f"{r['concurrency']}, mixed lengths") for r in tp["turboinfer_mixed_lengths"]]
        for r, label in rows:
            lines.append(
                f"| turboinfer | {label} | {r['tokens_per_s']:.1f} | "
                f"{r['tokens_per_cpu_s']:.1f} | {r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} "
                f"| {r['tpot_p50_ms']:.0f} / {r['tpot_p99_ms']:.0f} | "
                f"{r['kv_slots_unused_pct']:.1f}% (static {r['static_slots_unused_pct']:.1f}%) |")
        lines.append("")
    spec = results.get("speculative")
    if spec:
        lines += ["| workload | drafting | k | plain tokens/CPU-s | speculative tokens/CPU-s | "
                  "speed-up per CPU-s: median (min-max) | speed-up wall: median (min-max) | "
                  "acceptance | tokens per target forward | identical greedy output |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for workload in ("demo", "regenerate"):
            w = spec[workload]
            for name in ("draft", "draft_fixed", "ngram", "ngram_fixed"):
                if name not in w:
                    continue
                r = w[name]
                k = f"<= {r['k']}" if "speculation" in r else r["k"]
                lines.append(
                    f"| {workload} | {name} | {k} | {w['plain_tps']:.1f} | "
                    f"{r['spec_tps']:.1f} | {r['speedup']:.2f}x ({r['speedup_min']:.2f}-"
                    f"{r['speedup_max']:.2f}) | {r['speedup_wall']:.2f}x "
                    f"({r['speedup_wall_min']:.2f}-{r['speedup_wall_max']:.2f}) | "
                    f"{r['acceptance_rate']:.2f} | {r['tokens_per_target_forward']:.2f} | "
                    f"{r['identical_greedy_output']} |")
        lines.append("")
    quant_res = results.get("quant")
    if quant_res:
        lines += ["| weights | demo perplexity | increase | demo tokens/CPU-s | "
                  "110M tokens/CPU-s |", "|---|---|---|---|---|"]
        for mode, r in quant_res.items():
            lines.append(f"| {mode} | {r['perplexity']:.2f} | "
                         f"{r['perplexity_increase_pct']:+.2f}% | {r['demo_tps']:.1f} | "
                         f"{r.get('110m_tps', float('nan')):.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sections", default="throughput,speculative,quant")
    parser.add_argument("--model", help="speculative: this model folder or GGUF file in "
                                        "place of the demo model (prompt lookup only)")
    parser.add_argument("--spec-quant", default=None,
                        help="speculative: the target's quantization (int8, int4, q8) in "
                             "every engine compared; default, its own")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--gen-len", type=int, default=64)
    # One thread: on the shared recording machine two OpenMP threads made every op wait
    # for a descheduled worker (6x slower per decode step than one thread).
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--k", type=int, default=6,
                        help="most draft tokens per step (the engine picks k up to it)")
    parser.add_argument("--compare-fixed", action="store_true",
                        help="also run the draft proposing --k tokens every round and prompt "
                             "lookup uncut (the engine's choice off)")
    parser.add_argument("--ngram", type=int, default=3,
                        help="longest suffix n-gram prompt lookup matches")
    parser.add_argument("--ngram-k", type=int, default=8,
                        help="most prompt-lookup tokens per step")
    parser.add_argument("--regenerate-prompts", type=int, default=8,
                        help="prompts of the repetitive workload")
    parser.add_argument("--spec-rounds", type=int, default=7,
                        help="interleaved rounds of the compared engines (speculative, quant)")
    parser.add_argument("--spec-repeats", type=int, default=2,
                        help="times each prompt runs per engine in one speculative round")
    parser.add_argument("--ppl-tokens", type=int, default=8192)
    parser.add_argument("--output", default="results.json",
                        help="file beside this script the sections are merged into")
    parser.add_argument("--tables", action="store_true",
                        help="print the README tables from results.json and exit")
    args = parser.parse_args()
    if args.tables:
        print(markdown(json.loads((HERE / "results.json").read_text())))
        return
    torch.set_num_threads(args.threads)
    WORK.mkdir(parents=True, exist_ok=True)
    sections = args.sections.split(",")
    cpu = read_cpu()
    machine = {"cpu": cpu.model_name, "isa": sorted(cpu.features),
               "logical_cores": os.cpu_count(),
               "torch": torch.__version__, "threads": args.threads,
               "load_average_at_start": os.getloadavg()}
    results: dict[str, object] = {}
    for section in sections:
        start, load = time.perf_counter(), os.getloadavg()
        results[section] = {"throughput": throughput, "speculative": speculative,
                            "quant": quant}[section](args)
        if section == "speculative":
            # Recorded on its own (--sections speculative) more often than the rest, so
            # it carries its own machine, command and load.
            results[section]["recorded"] = {  # type: ignore[index]
                **machine, "command": " ".join(sys.argv), "load_average_at_start": load,
                "load_average_at_end": os.getloadavg()}
        print(f"{section}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
        print(json.dumps(results[section], indent=1), flush=True)
    out = HERE / args.output
    previous = json.loads(out.read_text()) if out.exists() else {}
    if set(sections) >= {"throughput", "quant"} or not previous:
        # The top-level machine and command describe the sections recorded together.
        results.update(machine=machine, command=" ".join(sys.argv),
                       load_average_at_end=os.getloadavg())
    out.write_text(json.dumps({**previous, **results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
