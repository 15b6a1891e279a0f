"""Write an F16 GGUF file from a quantized one: the same metadata, every matrix
dequantized by the ``gguf`` package and stored as F16 (vectors, the norms, as F32, as
llama.cpp's own converter keeps them), for side-by-side runs on half-precision weights.

    python benchmarks/llm/gguf_f16.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf -o smollm2-f16.gguf
    python benchmarks/llm/gguf_speed.py --gguf smollm2-f16.gguf --quant none \\
        --llamacpp-python VENV/bin/python --output gguf_speed_f16_zen4.json

llama.cpp runs F16 matrices as they are; turboinfer widens them to float32 at load, where
they are exactly fp16 numbers, so its native step keeps them in 16 bits with fp32
arithmetic (``NativeHalfKernel``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np

MOSTLY_F16 = 1      # llama.cpp's file type for F16 matrices


def write_f16(source: Path, target: Path) -> None:
    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(target, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value = MOSTLY_F16 if field.name == gguf.Keys.General.FILE_TYPE else field.contents()
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        values = values.astype(np.float16 if values.ndim > 1 else np.float32)
        writer.add_tensor(tensor.name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    write_f16(args.gguf, args.output)
    print(f"wrote {args.output} ({args.output.stat().st_size / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
