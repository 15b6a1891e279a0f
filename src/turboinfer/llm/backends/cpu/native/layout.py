"""The weight layouts of ``kernels.c``: tiles of 4 output rows, interleaved per block of
columns, so that one tile is one sequential stream through memory. The output rows are
padded with zero rows to a multiple of 4 and the columns with zeros to whole blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F

TILE_ROWS = 4


def _interleave(t: torch.Tensor, block: int) -> torch.Tensor:
    """``[N, K]`` -> ``[N4 / 4, K' / block, 4, block]`` (flattened), zero padded."""
    n, k = t.shape
    kp, n4 = -(-k // block) * block, -(-n // TILE_ROWS) * TILE_ROWS
    padded = F.pad(t, (0, kp - k, 0, n4 - n))
    tiles = padded.reshape(n4 // TILE_ROWS, TILE_ROWS, kp // block, block).permute(0, 2, 1, 3)
    return tiles.contiguous().reshape(-1)


def int8_tiles(q: torch.Tensor) -> tuple[torch.Tensor, int]:
    """int8 ``[N, K]`` in blocks of 32 bytes; returns (tiles, padded K)."""
    return _interleave(q, 32), -(-q.shape[1] // 32) * 32


AMX_ROWS, AMX_COLUMNS = 16, 64


def amx_int8_tiles(q: torch.Tensor) -> tuple[torch.Tensor, int]:
    """int8 ``[N, K]`` for ``amx.c``: blocks of 16 output rows, each a run of 1,024-byte
    tiles, one per 64 columns, in AMX's B layout (tile row r: the 16 outputs' columns
    4r..4r+3 side by side), then the 16 rows' sums as int32; returns (bytes, padded K)."""
    n, k = q.shape
    kp, n16 = -(-k // AMX_COLUMNS) * AMX_COLUMNS, -(-n // AMX_ROWS) * AMX_ROWS
    padded = F.pad(q, (0, kp - k, 0, n16 - n))
    blocks = n16 // AMX_ROWS
    tiles = padded.reshape(blocks, AMX_ROWS, kp // AMX_COLUMNS, AMX_COLUMNS // 4, 4)
    tiles = tiles.permute(0, 2, 3, 1, 4).reshape(blocks, -1)
    sums = padded.sum(dim=1, dtype=torch.int32).reshape(blocks, AMX_ROWS).view(torch.int8)
    return torch.cat([tiles, sums], dim=1).reshape(-1), kp


def f32_tiles(weight: torch.Tensor) -> tuple[torch.Tensor, int]:
    """fp32 ``[N, K]`` in blocks of 16 floats (fp16/bf16 in the same layout); returns
    (tiles, padded K)."""
    return _interleave(weight, 16), -(-weight.shape[1] // 16) * 16


def int4_tiles(packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """80-byte records per tile and group of 32: the 4 rows' 16 nibble bytes, their 4
    fp16 scales, their 4 fp16 minimums."""
    n, groups = scales.shape
    n4 = -(-n // TILE_ROWS) * TILE_ROWS
    nibbles = _interleave(packed, 16).reshape(n4 // TILE_ROWS, groups, 64)

    def per_group(t: torch.Tensor) -> torch.Tensor:     # [N, G] fp16 -> [N4/4, G, 8] bytes
        t = F.pad(t, (0, 0, 0, n4 - n)).reshape(n4 // TILE_ROWS, TILE_ROWS, groups)
        return t.permute(0, 2, 1).contiguous().view(torch.uint8)

    return torch.cat([nibbles, per_group(scales), per_group(mins)], dim=-1).reshape(-1)


def q8_tiles(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """136-byte records per tile and group of 32 (``kernels.c``'s q8 kernel): the 4 rows'
    32 int8 weights, then their 4 fp16 scales."""
    n, groups = scales.shape
    n4 = -(-n // TILE_ROWS) * TILE_ROWS
    weights = _interleave(q, 32).view(torch.uint8).reshape(n4 // TILE_ROWS, groups, 128)
    padded = F.pad(scales, (0, 0, 0, n4 - n)).reshape(n4 // TILE_ROWS, TILE_ROWS, groups)
    per_group = padded.permute(0, 2, 1).contiguous().view(torch.uint8)   # [N4/4, G, 8]
    return torch.cat([weights, per_group], dim=-1).reshape(-1)

